"""ddstore.torch.ScheduledSampler against the Go schedule it reads (`ddstore
schedule --emit-rank`, internal/schedule/testdata/golden.json) and against
ddstore.schedule.permutation: every sample once an epoch, exactly B per step
under locality, the ranks of a step together reading the global batch, loaders
over DistDataset reading the planned samples, and resuming mid-epoch after a
simulated crash with another number of loader workers."""

import json
import os
import pickle
import subprocess

import pytest

torch = pytest.importorskip("torch")
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

import ddstore  # noqa: E402
from conftest import ROOT, run_ranks  # noqa: E402
from ddstore.sampler import EpochPlan  # noqa: E402
from ddstore.schedule import permutation  # noqa: E402
from ddstore.torch import DistDataset, ScheduledSampler, ThreadDataLoader  # noqa: E402

GOLDEN = os.path.join(ROOT, "internal", "schedule", "testdata", "golden.json")


def emitted(binary, n, ranks, rpn, batch, epochs, capacity, policy, seed, rank, epoch, drop_last=False,
            iterations=None):
    """What `ddstore schedule --emit-rank --json` prints: (per-step sample
    lists, per-step hit lists, the epoch's permutation)."""
    args = [binary, "schedule", "--n", str(n), "--ranks", str(ranks), "--ranks-per-node", str(rpn), "--batch",
            str(batch), "--epochs", str(epochs), "--capacity", str(capacity), "--policy", policy, "--seed", str(seed),
            "--emit-rank", str(rank), "--epoch", str(epoch), "--emit-hits", "--json"]
    if drop_last:
        args.append("--drop-last")
    if iterations is not None:
        args += ["--iterations", str(iterations)]
    out = json.loads(subprocess.run(args, check=True, capture_output=True, text=True).stdout)
    return out["samples"], out["hits"], out["perm"]


def batches(sampler, epoch):
    sampler.set_epoch(epoch)
    return list(sampler)


def indexed_source(n):
    """Samples whose second field is their index."""
    return TensorDataset(torch.arange(n * 2, dtype=torch.float32).reshape(n, 2), torch.arange(n, dtype=torch.int64))


@pytest.fixture
def store(job):
    s = ddstore.Store()
    yield s
    s.close()


# -- the plan is Go's -------------------------------------------------------------------

def test_golden_schedules(ddstore_bin):
    """Every rank's batches and hits of every epoch equal the Go schedule
    pinned in internal/schedule/testdata/golden.json (capacity 16 < n 38)."""
    with open(GOLDEN, encoding="utf-8") as f:
        golden = json.load(f)
    assert [g["config"]["Policy"] for g in golden] == ["random", "solar", "locality"]
    for g in golden:
        c = g["config"]
        for r in range(c["Ranks"]):
            s = ScheduledSampler(c["N"], c["Batch"], seed=c["Seed"], policy=c["Policy"], capacity=c["Capacity"],
                                 drop_last=c["DropLast"], epochs=c["Epochs"], rank=r, ranks=c["Ranks"],
                                 ranks_per_node=c["RanksPerNode"], swarm_iterations=c["SwarmIterations"],
                                 binary=ddstore_bin)
            for e, ep in enumerate(g["epochs"]):
                assert batches(s, e) == [step[r]["samples"] for step in ep["steps"]], (c["Policy"], r, e)
                plan = s.plan(e)
                hits = "".join("".join("." if c == "." else "H" for c in step[r]["hits"]) for step in ep["steps"])
                assert "".join("H" if h else "." for h in plan.hits) == hits, (c["Policy"], r, e)


@pytest.mark.parametrize("policy,n,drop_last", [("locality", 50, False), ("locality", 50, True), ("random", 50, False),
                                                ("random", 51, True), ("solar", 50, False)])
def test_batches_equal_what_the_binary_prints(ddstore_bin, policy, n, drop_last):
    kw = dict(seed=9, policy=policy, capacity=20, drop_last=drop_last, epochs=4, ranks=4, ranks_per_node=2,
              swarm_iterations=50, binary=ddstore_bin)
    for r in range(4):
        s = ScheduledSampler(n, 3, rank=r, **kw)
        for e in (3, 0, 2):  # any order: each epoch is the e-th of the run
            want, hits, _ = emitted(ddstore_bin, n, 4, 2, 3, 4, 20, policy, 9, r, e, drop_last, iterations=50)
            assert batches(s, e) == want
            assert s.plan(e).hits.tolist() == [h for step in hits for h in step]
            assert len(s) == len(want)


def test_solar_ranks_make_the_global_batch(ddstore_bin):
    """Under solar, local batches differ in size, but the ranks of a step
    together read positions [s·B·P, (s+1)·B·P) of the epoch's permutation,
    the permutation that the run's epoch order gives."""
    n, ranks, b, epochs = 96, 4, 4, 5
    order = json.loads(subprocess.run([ddstore_bin, "schedule", "--n", str(n), "--ranks", str(ranks), "--batch", str(b),
                                       "--epochs", str(epochs), "--capacity", "48", "--policy", "solar", "--seed", "3",
                                       "--json"], check=True, capture_output=True, text=True).stdout)["epoch_order"]
    samplers = [ScheduledSampler(n, b, seed=3, policy="solar", capacity=48, epochs=epochs, rank=r, ranks=ranks,
                                 binary=ddstore_bin) for r in range(ranks)]
    sizes = set()
    for e in range(epochs):
        per = [batches(s, e) for s in samplers]
        perm = permutation(3, order[e], n)
        for st in range(len(per[0])):
            got = sorted(x for r in range(ranks) for x in per[r][st])
            assert got == sorted(perm[st * b * ranks:(st + 1) * b * ranks].tolist()), (e, st)
            sizes |= {len(per[r][st]) for r in range(ranks)}
    assert sizes != {b}  # re-dealing made local batches unequal somewhere


# -- one process over a DistDataset -----------------------------------------------------

def test_locality_single_process(store):
    n = 40
    ds = DistDataset(indexed_source(n), "sl", store=store)
    s = ScheduledSampler(ds, 4, seed=5)
    assert (s.rank, s.ranks, s.ranks_per_node, s.capacity, s.policy) == (0, 1, 1, n, "locality")
    assert len(s) == 10
    epochs = []
    for e in range(3):
        got = batches(s, e)
        assert all(len(b) == 4 for b in got)
        flat = [x for b in got for x in b]
        assert sorted(flat) == list(range(n))  # every sample once
        assert flat == permutation(5, e, n).tolist()  # one rank: the epoch's order itself
        assert s.plan(e).hits.all()  # capacity n: everything in memory
        epochs.append(got)
    assert epochs[0] != epochs[1] != epochs[2]
    assert batches(ScheduledSampler(ds, 4, seed=5), 1) == epochs[1]  # same seed, same batches
    assert batches(ScheduledSampler(ds, 4, seed=6), 1) != epochs[1]


def test_geometry_from_a_wrapped_store(ddstore_bin):
    """rank, ranks and ranks per node come from the store of the dataset,
    also through WindowedDataset's .ds and Subset's .dataset; arguments
    override it."""
    class FakeStore:
        rank, size, local_size = 3, 4, 2

    class Stored(torch.utils.data.Dataset):
        store = FakeStore()

        def __len__(self):
            return 64

    from ddstore.torch import WindowedDataset
    for d in (Stored(), torch.utils.data.Subset(Stored(), range(40)), WindowedDataset(Stored(), 3)):
        s = ScheduledSampler(d, 2, binary=ddstore_bin)
        assert (s.n, s.rank, s.ranks, s.ranks_per_node) == (len(d), 3, 4, 2)
    s = ScheduledSampler(Stored(), 2, rank=0, ranks=2, ranks_per_node=1, binary=ddstore_bin)
    assert (s.rank, s.ranks, s.ranks_per_node) == (0, 2, 1)


@pytest.mark.parametrize("drop_last", [False, True])
def test_padding_and_drop_last(ddstore_bin, drop_last):
    n, b = 37, 5
    perm = permutation(1, 0, n).tolist()
    loc = batches(ScheduledSampler(n, b, seed=1, drop_last=drop_last, binary=ddstore_bin), 0)
    rnd = batches(ScheduledSampler(n, b, seed=1, policy="random", drop_last=drop_last, binary=ddstore_bin), 0)
    if drop_last:
        assert [len(x) for x in loc] == [b] * 7 and sum(loc, []) == perm[:35]
        assert [len(x) for x in rnd] == [b] * 7 and sum(rnd, []) == perm[:35]
    else:  # locality pads the last global batch with the head; random keeps a short last batch
        assert [len(x) for x in loc] == [b] * 8 and sum(loc, []) == perm + perm[:3]
        assert [len(x) for x in rnd] == [b] * 7 + [2] and sum(rnd, []) == perm


def test_random_two_ranks_is_distributed_sampler_deal(ddstore_bin):
    """random: rank r takes positions r, r+P, ... of the padded permutation
    (DistributedSampler), in batches of B, the last one short."""
    n, b, ranks = 23, 4, 2
    perm = permutation(11, 2, n).tolist()
    padded = perm + perm[:ranks * -(-n // ranks) - n]
    for r in range(ranks):
        got = batches(ScheduledSampler(n, b, seed=11, policy="random", rank=r, ranks=ranks, binary=ddstore_bin), 2)
        mine = padded[r::ranks]
        assert got == [mine[i:i + b] for i in range(0, len(mine), b)]


@pytest.mark.parametrize("loader", ["thread", "torch"])
def test_loaders_read_the_planned_samples(store, loader):
    n = 45
    src = indexed_source(n)
    ds = DistDataset(src, "ld", store=store)
    s = ScheduledSampler(ds, 6, seed=2, capacity=20)  # capacity < n: the plan is the same, hits differ
    s.set_epoch(1)
    want = list(s)
    if loader == "thread":
        it = ThreadDataLoader(ds, batch_sampler=s, num_workers=3)
    else:
        it = DataLoader(ds, batch_sampler=s, num_workers=2, multiprocessing_context="fork", timeout=30)
    assert len(it) == len(want) == 8
    got = list(it)
    assert [b[1].tolist() for b in got] == want
    for b, idx in zip(got, want):
        assert torch.equal(b[0], src.tensors[0][idx])
    assert s.plan().hits.sum() == sum(x < 20 for b in want for x in b)  # locality pins samples 0..C-1


# -- resuming ----------------------------------------------------------------------------

def test_resume_plain_loop(ddstore_bin):
    kw = dict(seed=4, policy="random", ranks=3, rank=1, binary=ddstore_bin)
    full = ScheduledSampler(100, 5, **kw)
    run = batches(full, 2)
    s = ScheduledSampler(100, 5, **kw)
    s.set_epoch(2)
    it = iter(s)
    head = [next(it) for _ in range(3)]
    state = s.state_dict()
    assert state["step"] == 3 and state["epoch"] == 2 and head == run[:3]
    state = json.loads(json.dumps(state))  # survives a checkpoint as JSON
    del s, it  # the crash
    t = ScheduledSampler(100, 5, **kw)
    t.load_state_dict(state)
    assert t.state_dict()["step"] == 3
    t.set_epoch(2)  # the loop calls set_epoch with the saved epoch: the step stays
    assert list(t) == run[3:]
    assert t.state_dict()["step"] == len(run)
    assert list(t) == run  # the next pass of the epoch starts over
    t.load_state_dict(state, step=5)  # an explicit step wins
    t.set_epoch(3)  # another epoch starts at 0
    assert list(t) == batches(full, 3)
    t.load_state_dict(state)
    assert list(t) == run[3:]
    assert pickle.loads(pickle.dumps(t)).state_dict() == t.state_dict()


@pytest.mark.parametrize("policy", ["locality", "random", "solar"])
def test_resume_after_crash_with_other_workers(store, policy):
    """Train k batches through a prefetching DataLoader (2 forked workers),
    counting consumed batches; crash; a new sampler and a ThreadDataLoader
    of 3 workers go on with exactly the batches the uninterrupted run had."""
    n, k = 60, 4
    src = indexed_source(n)
    ds = DistDataset(src, "rs", store=store)
    kw = dict(seed=8, policy=policy, capacity=30, epochs=3, swarm_iterations=20)
    ref = ScheduledSampler(ds, 5, **kw)
    ref.set_epoch(1)
    uninterrupted = [b[1].tolist() for b in DataLoader(ds, batch_sampler=ref)]
    assert len(uninterrupted) == 12

    s = ScheduledSampler(ds, 5, **kw)
    s.set_epoch(1)
    trained = []
    loader = DataLoader(ds, batch_sampler=s, num_workers=2, prefetch_factor=2, multiprocessing_context="fork",
                        timeout=30)
    for b in loader:
        trained.append(b[1].tolist())
        s.consumed()
        if len(trained) == k:
            state = s.state_dict()
            break
    assert trained == uninterrupted[:k]
    assert state["step"] == k and s._pos > k  # the loader had asked for more
    del loader, s

    with pytest.raises(ValueError, match="seed 8 in the state, 0 here"):
        ScheduledSampler(ds, 5, **{**kw, "seed": 0}).load_state_dict(state)
    t = ScheduledSampler(ds, 5, **kw)
    t.load_state_dict(state)
    t.set_epoch(1)
    rest = [b[1].tolist() for b in ThreadDataLoader(ds, batch_sampler=t, num_workers=3)]
    assert rest == uninterrupted[k:]
    t.set_epoch(2)
    ref.set_epoch(2)
    assert list(t) == list(ref)


def test_consumed_and_state_rules(ddstore_bin):
    s = ScheduledSampler(30, 3, binary=ddstore_bin)
    with pytest.raises(ValueError, match="consumed 1 batches of epoch 0, only 0 yielded"):
        s.consumed()
    it = iter(s)
    next(it), next(it)
    s.consumed()
    assert s.state_dict()["step"] == 1
    assert s.state_dict(step=2)["step"] == 2
    s.consumed(1)
    with pytest.raises(ValueError, match="consumed 3 batches"):
        s.consumed()
    with pytest.raises(ValueError, match="step 11 above the 10 steps"):
        s.state_dict(step=11)
    state = s.state_dict()
    t = ScheduledSampler(30, 3, binary=ddstore_bin)
    t.load_state_dict(state)
    it = iter(t)
    next(it)
    t.consumed()
    assert t.state_dict()["step"] == 3  # resumed at 2, one more consumed


@pytest.mark.parametrize("change,want", [
    (dict(n=31), "n 30 in the state, 31 here: the state is of another dataset"),
    (dict(seed=2), "seed 0 in the state, 2 here"),
    (dict(policy="random"), "policy 'locality' in the state, 'random' here"),
    (dict(drop_last=True), "drop_last False in the state, True here"),
])
def test_load_state_of_another_plan(ddstore_bin, change, want):
    kw = dict(n=30, batch_size=3, ranks=1, policy="locality", capacity=None, drop_last=False)
    state = ScheduledSampler(kw.pop("n"), kw.pop("batch_size"), binary=ddstore_bin, **kw).state_dict()
    kw = {"n": 30, "batch_size": 3, **change}
    s = ScheduledSampler(kw.pop("n"), kw.pop("batch_size"), binary=ddstore_bin, **kw)
    with pytest.raises(ValueError, match=want):
        s.load_state_dict(state)


@pytest.mark.parametrize("policy", ["random", "locality"])
def test_resumes_on_another_node_layout(ddstore_bin, policy):
    """A state saved with 2 ranks per node loads with 1 and another
    capacity: the positions left are dealt over the new nodes (for random,
    by position, the batches the saved plan had)."""
    a = ScheduledSampler(40, 4, policy=policy, ranks=4, ranks_per_node=2, binary=ddstore_bin)
    a.set_epoch(1)
    it = iter(a)
    next(it)
    state = a.state_dict()
    rest = list(it)
    got = []
    for r in range(4):
        b = ScheduledSampler(40, 4, policy=policy, rank=r, ranks=4, ranks_per_node=1, capacity=8,
                             binary=ddstore_bin)
        b.load_state_dict(state)
        got.append(list(b))
    if policy == "random":
        assert got[0] == rest
    perm = permutation(0, 1, 40).tolist()
    padded = perm + perm[:8] if policy == "locality" else perm  # locality: 3 global batches of 16
    assert sorted(x for g in got for b in g for x in b) == sorted(padded[16:])


# -- bad input ---------------------------------------------------------------------------

@pytest.mark.parametrize("args,kw,want", [
    ((30, 4), dict(ranks=8), "batch_size 4 × ranks 8 = 32 above n 30"),
    ((30, 4), dict(capacity=31), "capacity 31 above n 30"),
    ((30, 0), {}, "batch_size 0: want an integer >= 1"),
    ((30, -2), {}, "batch_size -2"),
    ((30, 3), dict(capacity=-1), "capacity -1"),
    ((30, 3), dict(seed=-1), "seed -1"),
    ((30, 3), dict(policy="fifo"), "policy 'fifo'"),
    ((30, 3), dict(rank=2, ranks=2), r"rank 2 not in \[0, 2\)"),
    ((30, 3), dict(ranks=4, ranks_per_node=3), "ranks_per_node 3 does not divide ranks 4"),
    ((30, 3), dict(policy="solar"), "policy 'solar' orders all the job's epochs: pass epochs"),
    ((30, 3), dict(epochs=0), "epochs 0"),
    ((30, 3.0), {}, "batch_size 3.0: want an integer"),
    ((0, 3), {}, "n 0"),
    ((30, 3), dict(drop_last="yes"), "drop_last 'yes'"),
    # checked by the binary, its message passed on
    ((30, 3), dict(policy="random", ranks=4, capacity=2), "capacity 2 below ranks 4"),
])
def test_bad_input(ddstore_bin, args, kw, want):
    with pytest.raises(ValueError, match=want):
        ScheduledSampler(*args, binary=ddstore_bin, **kw)


def test_bad_epochs_and_states(ddstore_bin):
    s = ScheduledSampler(30, 3, epochs=2, binary=ddstore_bin)
    with pytest.raises(ValueError, match=r"epoch 2 not in \[0, 2\)"):
        s.set_epoch(2)
    with pytest.raises(ValueError, match="epoch -1"):
        s.set_epoch(-1)
    with pytest.raises(ValueError, match="state without step"):
        s.load_state_dict({k: v for k, v in s.state_dict().items() if k != "step"})
    with pytest.raises(ValueError, match="step 99 above the 10 steps"):
        s.load_state_dict({**s.state_dict(), "step": 99})
    with pytest.raises(ValueError, match="state of type list"):
        s.load_state_dict([])
    assert isinstance(s.plan(1), EpochPlan) and s.plan(1).steps == len(s) == 10


def test_old_binary(tmp_path):
    # The usage status tells it, not the text.
    fake = tmp_path / "ddstore"
    fake.write_text("#!/bin/sh\necho 'Usage: ddstore schedule [flags]' >&2\nexit 2\n")
    fake.chmod(0o755)
    with pytest.raises(RuntimeError, match="has no `schedule --emit-rank`"):
        ScheduledSampler(30, 3, binary=str(fake))


def test_exit_statuses_of_the_binary(ddstore_bin):
    """The binary under test exits as the vectors say cli.Main does, so the
    sampler's reading of its statuses holds for it."""
    with open(os.path.join(ROOT, "testdata", "vectors.json"), encoding="utf-8") as f:
        commands = json.load(f)["exit_codes"]["commands"]
    for c in commands:
        r = subprocess.run([ddstore_bin, *c["args"]], stdin=subprocess.DEVNULL, capture_output=True)
        assert r.returncode == c["exit"], (c, r.stderr)


# -- ranks on simulated nodes --------------------------------------------------------

RANKS = r"""
import json, sys, torch, ddstore
from ddstore.torch import DistDataset, ScheduledSampler, ThreadDataLoader

n = int(sys.argv[1])
src = torch.utils.data.TensorDataset(torch.arange(n, dtype=torch.float32) * 2, torch.arange(n))
ds = DistDataset(src, "d")
out = {"rank": ds.store.rank}
for policy in ("locality", "random"):
    s = ScheduledSampler(ds, 4, seed=6, policy=policy, capacity=n // 2)
    out[policy + "_geometry"] = [s.rank, s.ranks, s.ranks_per_node]
    out[policy] = []
    for e in range(2):
        s.set_epoch(e)
        got = [b for b in ThreadDataLoader(ds, batch_sampler=s, num_workers=2)]
        assert all(torch.equal(b[0], b[1].float() * 2) for b in got)  # the rows of the planned samples
        out[policy].append([b[1].tolist() for b in got])
    assert out[policy][1] == [list(map(int, s.plan(1).batch(k))) for k in range(len(s))]
print(json.dumps(out))
ds.store.close()
"""


@pytest.mark.parametrize("nodes", [["a", "b"], ["a", "a", "b", "b"]])
def test_ranks_on_nodes(job, ddstore_bin, nodes):
    n = 48
    outs = [json.loads(o.strip().splitlines()[-1]) for o in run_ranks(RANKS, nodes, job, timeout=120, args=(str(n),))]
    ranks = len(nodes)
    rpn = nodes.count("a")
    for r, o in enumerate(outs):
        assert o["rank"] == r and o["locality_geometry"] == [r, ranks, rpn]
    g = 4 * ranks
    for policy in ("locality", "random"):
        for e in range(2):
            perm = permutation(6, e, n).tolist()
            steps = len(outs[0][policy][e])
            assert steps == n // g
            for st in range(steps):
                per = [o[policy][e][st] for o in outs]
                union = [x for b in per for x in b]
                assert len(set(union)) == len(union) == g  # disjoint, each exactly B
                assert all(len(b) == 4 for b in per)
                assert sorted(union) == sorted(perm[st * g:(st + 1) * g])  # the global batch
            for r, o in enumerate(outs):
                want, _, _ = emitted(ddstore_bin, n, ranks, rpn, 4, e + 1, n // 2, policy, 6, r, e)
                assert o[policy][e] == want
