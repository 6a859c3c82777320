"""A real elastic run: a data-parallel training job (gloo, DDP)
over a dataset the store holds, stopped mid-epoch on 4 ranks, resumed on 2,
stopped again, resumed on 3: each run's ranks started with the variables
torchrun gives them (env:// rendezvous), or, with DDSTORE_TORCHRUN_TEST=1,
under torchrun's elastic launch itself (--nnodes 1:4, c10d rendezvous). The dataset is published once, by a job that
stays (split mode): the trainers read it from memory as readers, never from
the source. Checked: every sample of every epoch trained exactly once (by
index, over the three runs), and the loss of every step equal to that of an
uninterrupted run over the same global batches (the global batch is 24 on
every world size: 4 x 6, 2 x 12, 3 x 8, so DDP's averaged gradient is the
same)."""

import json
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

import ddstore  # noqa: E402
from conftest import ROOT  # noqa: E402
from ddstore.torch import DistDataset, ScheduledSampler  # noqa: E402

N, G, EPOCHS, SEED, LR = 192, 24, 3, 11, 0.05

TRAIN = r"""
import json, os, sys, torch, torch.distributed as dist, ddstore
from ddstore.torch import DistDatasetReader, ScheduledSampler, ThreadDataLoader
from ddstore_bench._job import end_rank  # the DDP model lets go of the gloo group first: no hang at exit

ckpt, log, stop_epoch, stop_pos, epochs, global_batch, seed, lr = sys.argv[1:9]
stop = (int(stop_epoch), int(stop_pos))
dist.init_process_group("gloo")
rank, size = dist.get_rank(), dist.get_world_size()
store = ddstore.Store(reader=True, rank=rank, size=size, spawn=False)
ds = DistDatasetReader("elastic", store=store)
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
ddp = torch.nn.parallel.DistributedDataParallel(model)
opt = torch.optim.SGD(model.parameters(), lr=float(lr))
sampler = ScheduledSampler(ds, int(global_batch) // size, seed=int(seed), rank=rank, ranks=size, ranks_per_node=size)
loader = ThreadDataLoader(ds, batch_sampler=sampler, num_workers=2, prefetch_factor=2)
start = 0
if os.path.exists(ckpt):
    with open(ckpt) as f:
        c = json.load(f)
    model.load_state_dict({k: torch.tensor(v) for k, v in c["model"].items()})
    loader.load_state_dict(c["loader"])
    start = c["loader"]["sampler"]["epoch"]
out = open(f"{log}.{rank}", "a")
for epoch in range(start, int(epochs)):
    sampler.set_epoch(epoch)
    for x, y, i in loader:
        opt.zero_grad()
        loss = ((ddp(x).squeeze(1) - y) ** 2).mean()
        loss.backward()
        opt.step()
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        state = loader.state_dict()
        out.write(json.dumps({"epoch": epoch, "position": state["sampler"]["position"], "idx": i.tolist(),
                              "loss": mean.item() / size, "world": size}) + "\n")
        out.flush()
        if (epoch, state["sampler"]["position"]) == stop:
            if rank == 0:  # SGD without momentum: the model is the whole training state
                with open(ckpt + ".tmp", "w") as f:
                    json.dump({"model": {k: v.tolist() for k, v in model.state_dict().items()}, "loader": state}, f)
                os.replace(ckpt + ".tmp", ckpt)
            dist.barrier()
            end_rank([ddp])
            print("stopped", rank, epoch, state["sampler"]["position"], flush=True)
            sys.exit(0)
end_rank([ddp])
print("done", rank, flush=True)
"""


def source():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(N, 4, generator=g)
    y = x @ torch.tensor([1.0, -2.0, 0.5, 3.0]) + 0.1 * torch.randn(N, generator=g)
    return x, y


@pytest.fixture
def store(job):
    s = ddstore.Store()
    yield s
    s.close()


def _port():
    import socket
    with socket.socket() as sk:
        sk.bind(("127.0.0.1", 0))
        return sk.getsockname()[1]


def _env(job):
    env = {**os.environ, **job, "PYTHONPATH": os.path.join(ROOT, "python"), "OMP_NUM_THREADS": "1"}
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    return env


def launch_torchrun(job, script, nproc, args):
    """Run nproc ranks under torchrun's elastic launch (--nnodes 1:4, the
    c10d rendezvous, one agent on this machine); each rank's last line,
    once all exited 0. --redirects 1 --tee 1: torchrun's default of 0 fails
    to start workers with Debian's torch 1.13 under Python 3.11 (its
    Std.from_str looks 0 up by iterating the Std flags, which Python 3.11
    no longer yields NONE from, and gets None)."""
    port = _port()
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1:4", "--nproc_per_node", str(nproc),
           "--rdzv_backend", "c10d", "--rdzv_endpoint", f"127.0.0.1:{port}", "--rdzv_id", f"el{port}",
           "--rdzv_conf", "last_call_timeout=1", "--monitor_interval", "0.1", "--max_restarts", "0",
           "--redirects", "1", "--tee", "1", str(script), *map(str, args)]
    r = subprocess.run(cmd, env=_env(job), capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr
    last = {}
    for line in r.stdout.splitlines():  # "[default<local rank>]:<line>"
        if line.startswith("[default") and "]:" in line:
            tag, text = line.split("]:", 1)
            last[int(tag[len("[default"):])] = text
    return [last[k] for k in sorted(last)]


def launch_env(job, script, nproc, args):
    """The same ranks started directly with the variables torchrun gives
    them (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT: the
    env:// rendezvous), without torchrun's agents, which take about as long
    again to start and stop."""
    env = {**_env(job), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_port()), "WORLD_SIZE": str(nproc),
           "LOCAL_WORLD_SIZE": str(nproc)}
    procs = [subprocess.Popen([sys.executable, str(script), *map(str, args)],
                              env={**env, "RANK": str(r), "LOCAL_RANK": str(r)}, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for r in range(nproc)]
    outs = []
    try:
        for r, p in enumerate(procs):
            out, _ = p.communicate(timeout=120)
            assert p.returncode == 0, f"rank {r} of {nproc} failed:\n{out}"
            outs.append(out.strip().splitlines()[-1])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    return outs


@pytest.mark.parametrize("launcher", [
    "env",
    pytest.param("torchrun", marks=pytest.mark.skipif(
        os.environ.get("DDSTORE_TORCHRUN_TEST") != "1",
        reason="torchrun's agents double the run's time: set DDSTORE_TORCHRUN_TEST=1")),
])
def test_stop_on_4_resume_on_2_then_3(store, job, tmp_path, launcher):
    launch = launch_torchrun if launcher == "torchrun" else launch_env
    x, y = source()
    DistDataset(torch.utils.data.TensorDataset(x, y, torch.arange(N)), "elastic", store=store)
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    ckpt, log = tmp_path / "ckpt.json", tmp_path / "log"
    common = (EPOCHS, G, SEED, LR)
    # 4 ranks: epoch 0, then 3 steps of epoch 1; 2 ranks: to step 2 of epoch 2; 3 ranks: the rest.
    assert launch(job, script, 4, (ckpt, log, 1, 3 * G, *common)) == [f"stopped {r} 1 72" for r in range(4)]
    assert launch(job, script, 2, (ckpt, log, 2, 2 * G, *common)) == [f"stopped {r} 2 48" for r in range(2)]
    assert launch(job, script, 3, (ckpt, log, -1, -1, *common)) == [f"done {r}" for r in range(3)]

    steps = {}  # (epoch, position) -> [per-rank records]
    for r in range(4):
        with open(f"{log}.{r}") as f:
            for line in f:
                rec = json.loads(line)
                steps.setdefault((rec["epoch"], rec["position"]), []).append(rec)
    # Every sample of every epoch exactly once, over the three runs.
    for e in range(EPOCHS):
        seen = sorted(i for (ep, _), recs in steps.items() if ep == e for rec in recs for i in rec["idx"])
        assert seen == list(range(N)), e
    worlds = [steps[k][0]["world"] for k in sorted(steps)]
    assert worlds == [4] * 11 + [2] * 7 + [3] * 6  # 8 steps an epoch: 8+3 on 4, 5+2 on 2, 6 on 3
    # The loss of each step: that of an uninterrupted run over the same global batches.
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    ref = ScheduledSampler(N, G, seed=SEED, binary=job["DDSTORE_BIN"])
    k = 0
    keys = sorted(steps)
    for e in range(EPOCHS):
        ref.set_epoch(e)
        for b in ref:
            recs = steps[keys[k]]
            assert sorted(i for rec in recs for i in rec["idx"]) == sorted(b)  # the same global batch
            opt.zero_grad()
            loss = ((model(x[b]).squeeze(1) - y[b]) ** 2).mean()
            loss.backward()
            opt.step()
            assert recs[0]["loss"] == pytest.approx(loss.item(), rel=1e-4, abs=1e-6), (keys[k], recs[0]["world"])
            k += 1
    assert k == len(keys) == EPOCHS * N // G
