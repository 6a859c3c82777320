"""The atomistic GNN training job: the same DDP training of a small
message-passing network (ddstore_bench.gnn.model) on the same structures,
run with each loader, and a table of what each cost.

    python -m ddstore_bench.gnn train [--json] [--loaders L ...] [--samples N]
        [--epochs E] [--batch B] [--ranks P] [--nodes K] [--workers W] [--threads T]
        [--prefetch S] [--data DIR]

The command generates the dataset under DIR when it is missing
(ddstore_bench.gnn.data), starts P ranks on this machine (ddstore.launch)
and prints the table; under a launcher of its own (torchrun: RANK and
WORLD_SIZE set) it is one rank of that job.

Loaders (each hands the loop this rank's batches as one graph of B
structures: atoms concatenated, a batch vector, edges shifted by the atoms
before them, as graph libraries collate):

* baseline: PyTorch's DataLoader over a DistributedSampler, each structure
  read with h5py from its own file (how such data usually come);
* pyddstore-bytes: DDStore's users' pattern through pyddstore: each
  structure pickled into bytes, every rank's bytes one uint8 variable, the
  offsets an allgather of sizes and a cumulative sum, each structure read
  by a byte-range get() of its own in a Dataset under PyTorch's DataLoader;
* ddstore: a DistDataset of the structures (ddstore.torch: one ragged
  variable per field whose size varies, atomic numbers, edges, edge
  lengths, and a fixed one for the energies), every rank holding its share
  [r N / P, (r + 1) N / P); ScheduledSampler("random") and ThreadDataLoader
  with the Graphs collate: a batch is one get_ragged per field, rows of
  other ranks included, read in the loop's thread (--threads 0); the
  sampler announces each batch --prefetch steps ahead (2), when the
  dataset sends the requests for its rows of other nodes, so that the
  replies wait in the socket when the loop asks for the batch (no thread,
  no process: --prefetch 0 asks for every batch only then, as the other
  loaders read theirs);
* ddstore-locality: the same DistDataset holding only the prefix of the
  structures that fills --capacity of the set's bytes (0.5), the agents
  reading the others from the flat file's values and offsets, coalesced
  and ahead of use; ScheduledSampler("locality") with each structure's
  bytes and the byte budget (the schedule pins that prefix, deals each
  step's storage reads by bytes and announces them two steps ahead).

All deal each epoch's permutation (ddstore.schedule.permutation of the seed
and the epoch) over the same global batches; all but ddstore-locality as
DistributedSampler does with drop_last, so each rank trains on the same
batches in the same order and the losses agree (a check of the data path);
ddstore-locality's ranks take other shares of each global batch (equal
losses but for the order of the sums). Per epoch the job records the
time the loop waited for batches (loading time, largest rank), the epoch
time, the storage reads (files opened by the baseline; structures read
from the file by the agents for ddstore, none once loaded; the hit rate and
the planned byte hit rate against the schedule's bounds) and the training
loss (the mean over the epoch's structures of the squared error of the
energy per atom, eV^2).
"""

import contextlib
import json
import os
import sys
import tempfile
import time

import numpy as np

from .._job import (BAR, NodeAgent, end_rank, fmt_list, launch_ranks, parse_loaders, print_result, say, start_rank,
                    table, under_launcher, write_result)
from . import data

__all__ = ["LOADERS", "DEFAULTS", "add_arguments", "config", "run", "rank_main", "report", "graph_batch"]

LOADERS = ("baseline", "pyddstore-bytes", "ddstore", "ddstore-locality")
DEFAULTS = {"samples": 512, "epochs": 4, "batch": 16, "ranks": 2}
FIELDS = ("z", "edge_index", "dist")  # what the network reads; plus the energy


def add_arguments(p):
    d = DEFAULTS
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    p.add_argument("--loaders", nargs="+", default=list(LOADERS), metavar="L",
                   help=f"loaders to run, in order (default: all: {' '.join(LOADERS)}; commas work too)")
    p.add_argument("--samples", type=int, default=d["samples"], help=f"structures N (default {d['samples']})")
    p.add_argument("--epochs", type=int, default=d["epochs"], help=f"E (default {d['epochs']})")
    p.add_argument("--batch", type=int, default=d["batch"],
                   help=f"structures per rank per step B (default {d['batch']})")
    p.add_argument("--ranks", type=int, default=d["ranks"],
                   help=f"processes P started here (default {d['ranks']}; under a launcher, its own)")
    p.add_argument("--nodes", type=int, default=1, help="simulated nodes for the ranks started here (default 1)")
    p.add_argument("--workers", type=int, default=0, help="DataLoader processes of the baseline (default 0)")
    p.add_argument("--threads", type=int, default=0,
                   help="ThreadDataLoader worker threads of ddstore and ddstore-locality (default 0: batches read "
                        "in the training loop's thread, as the other loaders read theirs by default)")
    p.add_argument("--prefetch", type=int, default=2,
                   help="steps ahead ScheduledSampler announces each batch of ddstore and ddstore-locality (default "
                        "2): ddstore-locality's agents stage the rows only the file holds, and both send the requests "
                        "for rows of other nodes then, read when the loop asks for the batch; 0: every batch asked "
                        "for only when the loop wants it, as the other loaders read theirs")
    p.add_argument("--capacity", type=float, default=0.5,
                   help="memory of ddstore-locality, a fraction of the set's bytes (default 0.5)")
    p.add_argument("--data", default=None,
                   help="dataset directory (default: $TMPDIR/ddstore-gnn-N; generated when missing)")
    p.add_argument("--seed", type=int, default=0, help="seed of the epochs' order and the model (default 0)")
    p.add_argument("--lr", type=float, default=2e-3, help="Adam learning rate (default 0.002)")


def _loaders(names):
    return parse_loaders(names, LOADERS)


def config(a, ranks):
    for name in ("samples", "epochs", "batch", "ranks", "nodes"):
        if getattr(a, name) < 1:
            raise ValueError(f"--{name} {getattr(a, name)}: want >= 1")
    if a.workers < 0:
        raise ValueError(f"--workers {a.workers}: want >= 0")
    if a.threads < 0:
        raise ValueError(f"--threads {a.threads}: want >= 0")
    if a.prefetch < 0:
        raise ValueError(f"--prefetch {a.prefetch}: want >= 0")
    if not 0 < a.capacity <= 1:
        raise ValueError(f"--capacity {a.capacity}: want a fraction of the set's bytes in (0, 1]")
    if a.batch * ranks > a.samples:
        raise ValueError(f"--batch {a.batch} x {ranks} ranks above --samples {a.samples}: not one global batch")
    d = os.path.abspath(a.data or os.path.join(tempfile.gettempdir(), f"ddstore-gnn-{a.samples}"))
    return {"loaders": _loaders(a.loaders), "samples": a.samples, "epochs": a.epochs, "batch": a.batch,
            "ranks": ranks, "data": d, "seed": a.seed, "workers": a.workers, "threads": a.threads, "lr": a.lr,
            "prefetch": a.prefetch,
            "data_seed": 0,
            "capacity": a.capacity,
            "flat": os.path.join(d, data.FLAT_NAME),
            "files": [os.path.join(d, data.FILES_DIR, data.file_name(i)) for i in range(a.samples)]}


def ensure_data(cfg):
    with contextlib.redirect_stdout(sys.stderr):
        data.generate(cfg["data"], cfg["samples"], seed=cfg["data_seed"])


def check_binary(cfg):
    """ddstore-locality has the agents read the flat HDF5 file: refuse early
    when the binary cannot."""
    if "ddstore-locality" not in cfg["loaders"]:
        return
    import subprocess
    from ddstore import Error, _agent
    try:
        b = _agent.find_binary()
        v = subprocess.run([b, "version"], capture_output=True, text=True, timeout=30).stdout
    except (Error, OSError, subprocess.SubprocessError) as e:
        raise ValueError(f"cannot run the ddstore binary: {e}") from None
    if "with HDF5" not in v:
        raise ValueError(f"the ddstore binary {b} is built without HDF5, and ddstore-locality reads the dataset's "
                         f"HDF5 file through the agents: rebuild it with libhdf5-dev installed (make deps build), or "
                         f"run --loaders baseline pyddstore-bytes ddstore")


def run(a):
    """`python -m ddstore_bench.gnn train`: returns the exit status."""
    if under_launcher():
        cfg = config(a, int(os.environ["WORLD_SIZE"]))
        check_binary(cfg)
        result = rank_main(cfg, generate=True)
        if result is not None:
            _print(result, a.json)
        return 0
    cfg = config(a, a.ranks)
    check_binary(cfg)
    ensure_data(cfg)
    say(f"gnn train: starting {cfg['ranks']} ranks ({', '.join(cfg['loaders'])})")
    rc, result = launch_ranks(cfg, "ddstore_bench.gnn.train", a.nodes, "gnn")
    if rc != 0:
        say(f"gnn train: the job failed (status {rc})")
        return rc
    _print(result, a.json)
    return 0


def _print(result, as_json):
    print_result(result, as_json, report)


# -- batches ----------------------------------------------------------------------------

def epoch_batches(seed, epoch, n, ranks, rank, batch):
    """This rank's batches of an epoch, as DistributedSampler deals
    ddstore's permutation with drop_last: rank r takes positions r, r + P,
    ... of the first (n // P) P, in batches of B, the last partial one
    dropped."""
    from ddstore.schedule import permutation
    per = n // ranks
    mine = permutation(seed, epoch, n)[:per * ranks][rank::ranks]
    return [mine[i:i + batch] for i in range(0, per // batch * batch, batch)]


def graph_batch(index, z, natoms, edge_index, nedges, dist, energy):
    """One graph of a batch of structures from their packed rows: z (A,)
    and edge_index (E, 2) in the structures' order with natoms and nedges
    per structure; edges shifted by the atoms before them, (2, E) int64."""
    import torch
    natoms = np.asarray(natoms, np.int64)
    nedges = np.asarray(nedges, np.int64)
    first = np.cumsum(natoms) - natoms
    ei = edge_index.astype(np.int64).T + np.repeat(first, nedges)
    return {"index": torch.from_numpy(np.asarray(index, np.int64)), "z": torch.from_numpy(np.asarray(z)),
            "edge_index": torch.from_numpy(ei), "dist": torch.from_numpy(np.asarray(dist, np.float32)),
            "batch": torch.from_numpy(np.repeat(np.arange(len(natoms)), natoms)),
            "energy": torch.from_numpy(np.asarray(energy, np.float64)),
            "natoms": torch.from_numpy(natoms.astype(np.float64)), "n": len(natoms)}


class StructureFiles:
    """One HDF5 file per structure, read by __getitem__ with h5py."""

    def __init__(self, paths):
        self.paths = list(paths)

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, i):
        import h5py
        with h5py.File(self.paths[i], "r") as f:
            s = {k: f[k][()] for k in FIELDS + ("energy",)}
        s["index"] = i
        return s


def collate_files(samples):
    cat = lambda k: np.concatenate([s[k] for s in samples])  # noqa: E731
    return graph_batch([s["index"] for s in samples], cat("z"), [len(s["z"]) for s in samples],
                       cat("edge_index"), [len(s["dist"]) for s in samples], cat("dist"),
                       [s["energy"] for s in samples])


class _Loader:
    def __init__(self, cfg, store, ranks, rank):
        self.cfg, self.store, self.ranks, self.rank = cfg, store, ranks, rank
        self.storage = 0

    def setup(self):
        pass

    def batches(self, e):
        return epoch_batches(self.cfg["seed"], e, self.cfg["samples"], self.ranks, self.rank, self.cfg["batch"])

    def prepare(self, e):
        """Before epoch e, outside its timing: plan it (the schedule is known
        before the epoch)."""

    def take_storage(self):
        s, self.storage = self.storage, 0
        return s

    def close(self):
        pass


class Baseline(_Loader):
    name = "baseline"

    def setup(self):
        from torch.utils.data import DataLoader
        self.ds = StructureFiles(self.cfg["files"])
        self.sampler = _ListSampler()
        self.loader = DataLoader(self.ds, batch_size=self.cfg["batch"], sampler=self.sampler, drop_last=True,
                                 num_workers=self.cfg["workers"], collate_fn=collate_files)

    def epoch(self, e):
        self.sampler.order = np.concatenate(self.batches(e)).tolist()
        for b in self.loader:
            self.storage += b["n"]  # each structure from its own file
            yield b


class _ListSampler:
    """A sampler of the order the loader sets before each epoch (the
    DistributedSampler deal of epoch_batches)."""

    order = ()

    def __iter__(self):
        return iter(self.order)

    def __len__(self):
        return len(self.order)


class FlatStructures:
    """The flat file as a map-style dataset of structures ({z, edge_index
    [2, e], dist, energy}, PyTorch Geometric's orientation), a contiguous
    range read at a time: what DistDataset loads each rank's share from."""

    def __init__(self, path):
        import h5py
        self.path = path
        with h5py.File(path, "r") as f:
            self.ao, self.eo = f["atom_offsets"][()], f["edge_offsets"][()]

    def __len__(self):
        return len(self.ao) - 1

    def __getitem__(self, i):
        return self.__getitems__([i])[0]

    def __getitems__(self, indices):
        import h5py
        idx = [int(i) for i in indices]
        if not idx:
            return []
        lo, hi = min(idx), max(idx) + 1
        ao, eo = self.ao, self.eo
        with h5py.File(self.path, "r") as f:
            z, energy = f["z"][ao[lo]:ao[hi]], f["energy"][lo:hi]
            ei, dist = f["edge_index"][eo[lo]:eo[hi]], f["dist"][eo[lo]:eo[hi]]
        out = []
        for i in idx:
            a0, a1, e0, e1 = ao[i] - ao[lo], ao[i + 1] - ao[lo], eo[i] - eo[lo], eo[i + 1] - eo[lo]
            out.append({"z": z[a0:a1], "edge_index": np.ascontiguousarray(ei[e0:e1].T), "dist": dist[e0:e1],
                        "energy": energy[i - lo]})
        return out


def flat_sizes(path):
    """Each structure's bytes in the store: z (1 B an atom), edge_index (8 B
    an edge), dist (4 B an edge), energy (8 B)."""
    import h5py
    with h5py.File(path, "r") as f:
        na, ne = np.diff(f["atom_offsets"][()]), np.diff(f["edge_offsets"][()])
    return (na + 12 * ne + 8).astype(np.int64)


class _Stored(_Loader):
    """DistDataset (one ragged variable per varying field) + ScheduledSampler
    + ThreadDataLoader with the Graphs collate: ddstore and
    ddstore-locality."""

    policy = "random"

    def dataset_args(self):
        return {}

    def sampler_args(self):
        return {}

    def setup(self):
        from ddstore.torch import DistDataset, Graphs, ScheduledSampler, ThreadDataLoader
        c = self.cfg
        self.var = f"gnn-{self.name}"
        self.ds = DistDataset(FlatStructures(c["flat"]), self.var, store=self.store, **self.dataset_args())
        self.storage += self.ds.hi - self.ds.lo
        self.sampler = ScheduledSampler(self.ds, c["batch"], seed=c["seed"], policy=self.policy, drop_last=True,
                                        epochs=c["epochs"], prefetch=c.get("prefetch", 2), **self.sampler_args())
        self.loader = ThreadDataLoader(self.ds, batch_sampler=self.sampler, num_workers=c["threads"],
                                       collate_fn=Graphs(edges={"edge_index": "z"}))
        self._prof = self._profile()

    def prepare(self, e):
        self.sampler.set_epoch(e)
        self.sampler.plan(e, hits=self.policy == "locality")  # cached for the iteration

    def _profile(self):
        p = self.store.get_profile(f"{self.var}/z")
        return p["rows"], p["storage_rows"]

    def epoch(self, e):
        self.sampler.set_epoch(e)
        for g in self.loader:
            ptr = g["ptr"].numpy()
            yield {"index": None, "z": g["z"], "edge_index": g["edge_index"].long(), "dist": g["dist"],
                   "batch": g["batch"], "energy": g["energy"].double(),
                   "natoms": torch_from(np.diff(ptr).astype(np.float64)), "n": len(ptr) - 1}
        rows, storage = self._profile()
        self.storage += storage - self._prof[1]
        self._prof = (rows, storage)

    def close(self):
        self.ds.free()


def torch_from(a):
    import torch
    return torch.from_numpy(a)


class InMemory(_Stored):
    """The whole set in the ranks' memory; ScheduledSampler("random") deals
    the permutation as DistributedSampler does: the baseline's batches."""

    name = "ddstore"


class Locality(_Stored):
    """Half the set's bytes (--capacity) in memory, a prefix of the
    structures; the agents read the others from the flat file's values and
    offsets, coalesced and ahead of use; ScheduledSampler("locality") with
    the structures' sizes and the byte budget."""

    name = "ddstore-locality"
    policy = "locality"

    def setup(self):
        self.sizes = flat_sizes(self.cfg["flat"])
        self.budget = int(self.cfg["capacity"] * int(self.sizes.sum()))
        rpn = self.store.local_size if self.ranks % max(1, self.store.local_size) == 0 else 1
        self.summary = schedule_summary(self.sizes, self.budget, self.ranks, rpn, self.cfg)
        self.held = int(self.summary["pinned_samples"])
        super().setup()

    def dataset_args(self):
        h5 = self.cfg["flat"]
        return {"capacity": self.held, "backing": {
            "z": (f"{h5}:/z", f"{h5}:/atom_offsets"), "edge_index": (f"{h5}:/edge_index", f"{h5}:/edge_offsets"),
            "dist": (f"{h5}:/dist", f"{h5}:/edge_offsets"), "energy": f"{h5}:/energy"}}

    def sampler_args(self):
        return {"sizes": self.sizes, "capacity_bytes": self.budget}

    def planned_bytes(self, e):
        """(bytes, of them from storage) this rank reads in epoch e, as
        planned."""
        p = self.sampler.plan(e, hits=True)
        return [int(p.bytes.sum()), int(p.storage_bytes.sum())]


def schedule_summary(sizes, budget, ranks, rpn, cfg):
    """The schedule's summary under a budget of bytes: among its figures,
    pinned_samples, how many structures (a prefix) locality pins, which is
    what the dataset holds in memory, and the hit rates' bounds."""
    import subprocess
    import tempfile
    from ddstore import _agent
    with tempfile.NamedTemporaryFile(suffix=".npy") as f:
        np.save(f, sizes)
        f.flush()
        out = subprocess.run([_agent.find_binary(), "schedule", "--sizes", f.name, "--capacity-bytes", str(budget),
                              "--ranks", str(ranks), "--ranks-per-node", str(rpn), "--batch", str(cfg["batch"]),
                              "--epochs", "1", "--policy", "locality", "--json"],
                             capture_output=True, text=True, check=True).stdout
    return json.loads(out)


class PackedBytes(_Loader):
    """DDStore's users' pattern, through pyddstore: each structure pickled
    into bytes, every rank's bytes one uint8 variable, the offsets an
    allgather of sizes and a cumulative sum, and each structure read by its
    own byte-range get() in the dataset's __getitem__ under PyTorch's
    DataLoader."""

    name = "pyddstore-bytes"

    def setup(self):
        import pickle

        import h5py
        import pyddstore
        import torch.distributed as dist
        from torch.utils.data import DataLoader
        c, P, r = self.cfg, self.ranks, self.rank
        n = c["samples"]
        lo, hi = r * n // P, (r + 1) * n // P
        with h5py.File(c["flat"], "r") as f:
            ao, eo = f["atom_offsets"][lo:hi + 1], f["edge_offsets"][lo:hi + 1]
            cols = {k: f[k][(ao if k == "z" else eo)[0]:(ao if k == "z" else eo)[-1]] for k in FIELDS}
            energy = f["energy"][lo:hi]
        blobs = []
        for j in range(hi - lo):
            a0, a1 = ao[j] - ao[0], ao[j + 1] - ao[0]
            e0, e1 = eo[j] - eo[0], eo[j + 1] - eo[0]
            s = {"z": cols["z"][a0:a1], "edge_index": cols["edge_index"][e0:e1], "dist": cols["dist"][e0:e1],
                 "energy": energy[j], "index": lo + j}
            blobs.append(np.frombuffer(pickle.dumps(s, protocol=pickle.HIGHEST_PROTOCOL), np.uint8))
        sizes = [None] * P
        dist.all_gather_object(sizes, [len(b) for b in blobs])
        flat_sizes = np.array([x for part in sizes for x in part], np.int64)
        self.offsets = np.concatenate([[0], np.cumsum(flat_sizes)])
        self.dds = pyddstore.PyDDStore(None)
        self.dds.add("gnn-bytes", np.concatenate(blobs))
        self.storage += hi - lo
        self.ds = _BytesDataset(self.dds, self.offsets)
        self.sampler = _ListSampler()
        self.loader = DataLoader(self.ds, batch_size=c["batch"], sampler=self.sampler, drop_last=True,
                                 num_workers=0, collate_fn=collate_files)

    def epoch(self, e):
        self.sampler.order = np.concatenate(self.batches(e)).tolist()
        yield from self.loader

    def close(self):
        self.dds.free()


class _BytesDataset:
    def __init__(self, dds, offsets):
        self.dds, self.offsets = dds, offsets

    def __len__(self):
        return len(self.offsets) - 1

    def __getitem__(self, i):
        import pickle
        lo, hi = int(self.offsets[i]), int(self.offsets[i + 1])
        buf = np.empty(hi - lo, np.uint8)
        self.dds.get("gnn-bytes", buf, lo)
        return pickle.loads(buf.tobytes())


def make_loader(name, cfg, store, ranks, rank):
    return {"baseline": Baseline, "ddstore": InMemory, "pyddstore-bytes": PackedBytes,
            "ddstore-locality": Locality}[name](cfg, store, ranks, rank)


# -- one rank ---------------------------------------------------------------------------

def rank_main(cfg, generate=False):
    """One rank of the job; returns the result on rank 0 (None elsewhere)."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import ddstore
    from .model import EnergyNet, per_structure_loss

    rank, ranks, local_rank = start_rank()
    if generate and rank == 0:
        ensure_data(cfg)
    dist.barrier()
    E, B = cfg["epochs"], cfg["batch"]
    store = ddstore.Store()
    agent = NodeAgent(store, local_rank)
    data_index = _EnergyIndex(cfg["flat"])

    def log(msg):
        if rank == 0:
            say(f"gnn train: {msg}")

    runs = []
    for name in cfg["loaders"]:
        loader = make_loader(name, cfg, store, ranks, rank)
        a0 = agent.counters()
        dist.barrier()
        t = time.perf_counter()
        loader.setup()
        setup_s = time.perf_counter() - t
        dist.barrier()
        torch.manual_seed(cfg["seed"])
        model = DDP(EnergyNet())
        opt = torch.optim.Adam(model.parameters(), lr=cfg["lr"])
        runs.append({"name": name, "loader": loader, "model": model, "opt": opt, "setup_s": setup_s,
                     "setup_storage": loader.take_storage(), "setup_agent": NodeAgent.delta(a0, agent.counters()),
                     "epochs": []})
        log(f"{name}: set up in {setup_s:.2f} s")
    # The loaders' epochs in turn (epoch 1 of each, then epoch 2 of each,
    # ...), so that whatever else the machine runs weighs on all alike.
    for e in range(E):
        for run_ in runs:
            loader, model, opt = run_["loader"], run_["model"], run_["opt"]
            loader.prepare(e)
            a1 = agent.counters()
            dist.barrier()
            load_s, loss_sum, n, errors, seen = 0.0, 0.0, 0, 0, []
            it = loader.epoch(e)
            t0 = time.perf_counter()
            while True:
                tl = time.perf_counter()
                try:
                    b = next(it)
                except StopIteration:
                    load_s += time.perf_counter() - tl
                    break
                load_s += time.perf_counter() - tl
                idx, bad = data_index.check(b)
                errors += bad
                seen.extend(idx.tolist())
                pred = model(b["z"], b["edge_index"], b["dist"], b["batch"], b["n"])
                losses = per_structure_loss(pred.double(), b["energy"], b["natoms"])
                opt.zero_grad()
                (losses.sum() / B).backward()
                opt.step()
                loss_sum += float(losses.detach().sum())
                n += b["n"]
            epoch_s = time.perf_counter() - t0
            dist.barrier()
            planned = loader.planned_bytes(e) if hasattr(loader, "planned_bytes") else None
            run_["epochs"].append({"load_s": load_s, "epoch_s": epoch_s, "samples": n, "loss_sum": loss_sum,
                                   "storage": loader.take_storage(), "errors": errors, "seen": seen,
                                   "planned_bytes": planned,
                                   "agent": NodeAgent.delta(a1, agent.counters())})
            log(f"{run_['name']}: epoch {e + 1}/{E}: {epoch_s:.2f} s, waited {load_s:.3f} s for data, "
                f"loss {loss_sum / max(n, 1):.6f} (rank 0)")
    results = {}
    for run_ in runs:
        run_["loader"].close()
        mine = {k: run_[k] for k in ("setup_s", "setup_storage", "setup_agent", "epochs")}
        mine["schedule"] = getattr(run_["loader"], "summary", None)
        gathered = [None] * ranks
        dist.all_gather_object(gathered, mine)
        if rank == 0:
            results[run_["name"]] = summarize(gathered, cfg)
    store.close()
    out = None
    if rank == 0:
        out = {k: cfg.get(k) for k in ("ranks", "epochs", "batch", "samples", "seed", "workers", "threads", "prefetch",
                                        "data")}
        out["loaders"] = results
        write_result(cfg, out)
    dist.barrier()
    end_rank([run_["model"] for run_ in runs])
    return out


class _EnergyIndex:
    """Which structure each graph of a batch is, by its energy (EMT's, of
    rattled atoms: no two alike), and whether its rows are that structure's:
    its atom and edge counts, and the index the loader says where it says
    one. check returns (indices, -1 for an unknown energy; errors)."""

    def __init__(self, path):
        import h5py
        with h5py.File(path, "r") as f:
            self.energy = f["energy"][()]
            self.natoms = np.diff(f["atom_offsets"][()])
            self.nedges = np.diff(f["edge_offsets"][()])
        self.by_energy = {e.tobytes(): i for i, e in enumerate(self.energy)}
        if len(self.by_energy) != len(self.energy):
            raise ValueError(f"{path}: two structures of the same energy: graphs cannot be told apart by it")

    def check(self, b):
        energy = b["energy"].numpy()
        idx = np.array([self.by_energy.get(e.tobytes(), -1) for e in energy], np.int64)
        nat = b["natoms"].numpy().astype(np.int64)
        ned = np.bincount(b["batch"].numpy()[b["edge_index"].numpy()[0]], minlength=len(idx))
        known = idx >= 0
        bad = ~known
        bad[known] |= (self.natoms[idx[known]] != nat[known]) | (self.nedges[idx[known]] != ned[known])
        if b["index"] is not None:
            bad |= b["index"].numpy() != idx
        return idx, int(bad.sum())


def summarize(per_rank, cfg):
    E = cfg["epochs"]
    eps = [[r["epochs"][e] for r in per_rank] for e in range(E)]
    samples = [sum(x["samples"] for x in ep) for ep in eps]
    seen = [sorted(i for x in ep for i in x["seen"]) for ep in eps]

    def agent_rows(ep, key="storage_rows"):
        d = [x["agent"] for x in ep if x["agent"] is not None]
        return sum(a.get(key, 0) for a in d) if d else None

    return {
        "loading_seconds": sum(max(x["load_s"] for x in ep) for ep in eps),
        "loading_seconds_per_epoch": [max(x["load_s"] for x in ep) for ep in eps],
        "epoch_seconds_per_epoch": [max(x["epoch_s"] for x in ep) for ep in eps],
        "train_loss_per_epoch": [sum(x["loss_sum"] for x in ep) / max(n, 1) for ep, n in zip(eps, samples)],
        "samples_per_epoch": samples,
        "storage_reads_per_epoch": [sum(x["storage"] for x in ep) for ep in eps],
        "agent_storage_rows_per_epoch": [agent_rows(ep) for ep in eps],
        # of the file's rows: read ahead and served from staging; announced
        # after their read on demand (late)
        "agent_staged_rows_per_epoch": [agent_rows(ep, "staged_rows") for ep in eps],
        "agent_prefetch_late_per_epoch": [agent_rows(ep, "prefetch_late") for ep in eps],
        "content_errors": sum(x["errors"] for ep in eps for x in ep),
        "repeated_per_epoch": [len(s) - len(set(s)) for s in seen],
        "setup_seconds": max(r["setup_s"] for r in per_rank),
        "setup_storage_reads": sum(r["setup_storage"] for r in per_rank),
        "hit_rate_per_epoch": [1 - sum(x["storage"] for x in ep) / max(n, 1) for ep, n in zip(eps, samples)],
        "planned_byte_hit_rate_per_epoch": [_byte_hit_rate(ep) for ep in eps],
        "schedule": per_rank[0]["schedule"],
    }


def _byte_hit_rate(ep):
    p = [x["planned_bytes"] for x in ep if x["planned_bytes"] is not None]
    if not p:
        return None
    return 1 - sum(b[1] for b in p) / max(sum(b[0] for b in p), 1)


def report(r):
    out = [f"gnn train: {r['ranks']} ranks, {r['samples']} structures, batch {r['batch']} per rank, "
           f"{r['epochs']} epochs, seed {r['seed']}, baseline workers {r['workers']}, ddstore threads "
           f"{r.get('threads', 0)}, ddstore prefetch {r.get('prefetch', 2)}", f"data: {r['data']}", ""]
    base = r["loaders"].get("baseline")
    rows = [("loader", "loading s", "x shorter", "epoch s", "storage reads/epoch", "hit rate", "set-up s",
             "loss (last)", "max dloss", "errors")]
    for name, s in r["loaders"].items():
        out.append(f"{'*' * 12} {name} {'*' * 12}")
        out.append(f"DataLoading time: {s['loading_seconds']:.3f} s; per epoch "
                   f"{fmt_list(s['loading_seconds_per_epoch'], '.3f')} s")
        out.append(f"Epoch time: {fmt_list(s['epoch_seconds_per_epoch'], '.3f')} s")
        out.append(f"Training Loss: {fmt_list(s['train_loss_per_epoch'], '.6f')}")
        out.append(f"Storage reads per epoch: {fmt_list(s['storage_reads_per_epoch'], 'd')} of "
                   f"{fmt_list(s['samples_per_epoch'], 'd')} structures; set-up {s['setup_seconds']:.2f} s, "
                   f"{s['setup_storage_reads']} structures loaded into memory")
        out.append(f"Hit rate per epoch: {fmt_list(s['hit_rate_per_epoch'], '.3f')}")
        if s["schedule"] is not None:
            sc = s["schedule"]
            out.append(f"Memory: {sc['capacity_bytes']} of {sc['total_bytes']} bytes, {sc['pinned_samples']} "
                       f"structures pinned; bounds: sample hit rate {sc['sample_bound']:.3f}, byte hit rate "
                       f"{sc['byte_bound']:.3f}; planned byte hit rate "
                       f"{fmt_list(s['planned_byte_hit_rate_per_epoch'], '.3f')}")
        out.append(BAR)
        out.append("")
        shorter = dl = "-"
        if base is not None and name != "baseline":
            if s["loading_seconds"] > 0:
                shorter = f"{base['loading_seconds'] / s['loading_seconds']:.1f}x"
            d = [abs(a - b) / abs(b) for a, b in zip(s["train_loss_per_epoch"], base["train_loss_per_epoch"]) if b]
            dl = f"{max(d):.1e}" if d else "-"
        rows.append((name, f"{s['loading_seconds']:.3f}", shorter,
                     f"{float(np.median(s['epoch_seconds_per_epoch'])):.3f}",
                     f"{float(np.mean(s['storage_reads_per_epoch'])):.0f}",
                     f"{float(np.mean(s['hit_rate_per_epoch'])):.3f}", f"{s['setup_seconds']:.2f}",
                     f"{s['train_loss_per_epoch'][-1]:.6f}", dl, str(s["content_errors"])))
    out.append("Comparison (loading: time the loops waited for batches, summed over epochs, largest rank; epoch s: "
               "median; x shorter: baseline loading / loading; max dloss: largest relative difference of an epoch's "
               "loss from the baseline's; errors: graphs whose energy or atom/edge counts were not their "
               "structure's)")
    out.extend(table(rows))
    return "\n".join(out) + "\n"


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    with open(argv[0]) as f:
        cfg = json.load(f)
    rank_main(cfg)
    return 0


if __name__ == "__main__":
    sys.exit(main())
