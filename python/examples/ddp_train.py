"""Data-parallel training (DDP, gloo, CPU) whose samples come from ddstore.

Each rank loads its share of a synthetic regression dataset into the store
(DistDataset), a DistributedSampler gives each rank its part of every epoch,
and the DataLoader reads any sample from whichever rank holds it. Rank 0
prints the mean loss of each epoch; the script exits 1 unless the last
epoch's loss is under half the first's.

    python -m ddstore.launch -n 2 examples/ddp_train.py --epochs 5
    mpirun -np 2 python examples/ddp_train.py           # Open MPI's environment
    srun -n 2 python examples/ddp_train.py              # Slurm's environment

The rank comes from torchrun's variables (RANK, WORLD_SIZE, LOCAL_RANK,
MASTER_ADDR, MASTER_PORT); when RANK is unset they are derived from Open
MPI's (OMPI_COMM_WORLD_*), MPICH's (PMI_*) or Slurm's (SLURM_PROCID, ...),
with MASTER_ADDR 127.0.0.1 and MASTER_PORT 29500 unless set.
"""

import argparse
import os
import sys
import time

# Seconds a DataLoader worker may take to answer before the loader raises: a
# batch takes milliseconds.
WORKER_TIMEOUT_S = 60


def say(msg, file=None):
    """A whole line in one write (mpirun may interleave the pieces of a print)."""
    f = file or sys.stdout
    f.write(msg + "\n")
    f.flush()


def torch_env_from_launcher(env=os.environ):
    """Fill in torchrun's variables from Open MPI, MPICH or Slurm when RANK
    is unset (so that init_process_group(init_method="env://") works under
    mpirun or srun). Returns the launcher's name."""
    if env.get("RANK"):
        return "torchrun"
    for name, rank, size, lrank, lsize in (
            ("openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
             "OMPI_COMM_WORLD_LOCAL_SIZE"),
            ("mpich", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"),
            ("slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE")):
        if env.get(rank) and env.get(size):
            env["RANK"], env["WORLD_SIZE"] = env[rank], env[size]
            env["LOCAL_RANK"] = env.get(lrank) or "0"
            if env.get(lsize):
                env["LOCAL_WORLD_SIZE"] = env[lsize]
            break
    else:
        name = "single"
        env["RANK"], env["WORLD_SIZE"], env["LOCAL_RANK"], env["LOCAL_WORLD_SIZE"] = "0", "1", "0", "1"
    env.setdefault("MASTER_ADDR", "127.0.0.1")
    env.setdefault("MASTER_PORT", "29500")
    return name


class Regression:
    """n samples of `features` standard normal features; the target is a
    fixed linear function of them plus small noise. Deterministic, so that
    every rank builds the same dataset (each loads only its share)."""

    def __init__(self, n=2048, features=16, seed=0):
        import torch
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, features, generator=g)
        w = torch.randn(features, 1, generator=g)
        self.y = self.x @ w + 0.5 + 0.01 * torch.randn(n, 1, generator=g)

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--batch", type=int, default=64, help="batch size per rank")
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--samples", type=int, default=2048)
    ap.add_argument("--threads", type=int, default=0,
                    help="read with a ThreadDataLoader of this many threads (0: torch's DataLoader)")
    ap.add_argument("--workers", type=int, default=0,
                    help="torch DataLoader worker processes (forked once, before the process group starts)")
    args = ap.parse_args(argv)

    launcher = torch_env_from_launcher()
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader, DistributedSampler

    from ddstore.torch import DistDataset, ThreadDataLoader

    torch.set_num_threads(1)
    rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])

    t0 = time.perf_counter()
    # Collective: each rank reads source[i] for its contiguous share only;
    # the store finds rank and size in the same environment as torch.
    ds = DistDataset(Regression(args.samples), "train", comm=None)
    if rank == 0:
        say(f"{launcher}: {size} ranks, {len(ds)} samples loaded in {time.perf_counter() - t0:.2f}s")

    sampler = DistributedSampler(ds, num_replicas=size, rank=rank, shuffle=True, seed=0)
    if args.threads:
        loader = ThreadDataLoader(ds, batch_size=args.batch, sampler=sampler, num_workers=args.threads)
    elif args.workers:
        # The workers are forked once, here (iter starts them; each epoch's
        # iter(loader) then reuses them), before init_process_group: once
        # gloo's threads run, a fork may deadlock the child, and its rank
        # waits for it forever (CPython before 3.12: a thread that is not
        # Python's can hold the interpreter's head lock at the fork; gloo's
        # take it to free a tensor's Python object). The timeout makes a
        # worker that stops answering an error that says so.
        loader = DataLoader(ds, batch_size=args.batch, sampler=sampler, num_workers=args.workers,
                            persistent_workers=True, timeout=WORKER_TIMEOUT_S)
        iter(loader)
    else:
        loader = DataLoader(ds, batch_size=args.batch, sampler=sampler)

    dist.init_process_group("gloo", init_method="env://")

    torch.manual_seed(0)  # the same initial weights on every rank (DDP broadcasts rank 0's anyway)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    loss_fn = torch.nn.MSELoss()

    losses = []
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        total = torch.zeros(2)
        for x, y in loader:
            opt.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()
            total += torch.tensor([loss.item() * len(y), len(y)])
        dist.all_reduce(total)
        mean = (total[0] / total[1]).item()
        losses.append(mean)
        if rank == 0:
            say(f"epoch {epoch} loss {mean:.6f}")

    remote = ds.store.get_profile("train/0")["remote_rows"]
    say(f"rank {rank}: read {remote} rows held on other nodes")
    ds.close()
    dist.barrier()
    dist.destroy_process_group()
    if len(losses) >= 2 and not losses[-1] < 0.5 * losses[0]:
        if rank == 0:
            say(f"loss did not fall: first {losses[0]:.6f}, last {losses[-1]:.6f}", sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
