"""The four loaders the CosmoFlow-like benchmark compares (python -m ddstore_bench.cosmoflow train|io).
Each hands the loop this rank's batches of every epoch as (x, y) tensors,
x int16 (b, C, S, S, S) and y float32 (b, 4), and says which samples it
promised (promised(epoch), in order) and what it read (take_stats()).

* baseline: PyTorch's DataLoader over a DistributedSampler, each sample read
  with h5py from its own file, as SOLAR's baseline does. The sampler follows
  DistributedSampler's rules with ddstore's permutation (ddstore.schedule) in
  place of torch.randperm, so that its global batches are the other
  loaders'.
* ddstore: DistDataset holding the whole set in the job's memory (DDStore's
  way), batches from ScheduledSampler("random"): DistributedSampler's deal
  with the same permutation as the baseline, so each rank trains on the
  baseline's very batches, in the same order (the losses are the same to the
  bit: a check of the data path).
* ddstore-locality: DistDataset holding samples [0, C), the agents reading
  the others from the chunked HDF5 file (coalesced, and ahead of use as the
  sampler announces them); ScheduledSampler("locality", capacity=C).
* ddstore-solar: SOLAR's schedule (ScheduledSampler("solar", capacity=C)):
  every rank keeps a FIFO buffer of C/P samples in its own memory, exactly
  as the schedule's simulation keeps it (internal/schedule: random.go's
  fifo, solar.go's re-dealt steps), and serves the plan's hits from it; the
  misses are read through the store from the chunked file (a DistDataset of
  capacity 0 with backing), announced steps ahead. A hit the buffer lacks is
  read from the file too and counted (take_stats()["missing"]): it must stay
  0.

All use drop_last: with it every loader's step s covers the same positions
[s*B*P, (s+1)*B*P) of the epoch's permutation, so every global batch is the
same set of samples (solar runs the epochs in its own order).
"""

import os

import numpy as np

from ddstore.schedule import permutation

__all__ = ["LOADERS", "make_loader", "drop_page_cache", "resident_fraction", "ChunkedSource", "SampleFiles",
           "permutation_sampler", "FifoBuffer"]

LOADERS = ("baseline", "ddstore", "ddstore-solar", "ddstore-locality")


def drop_page_cache(paths):
    """posix_fadvise(DONTNEED) on every file of paths, after fdatasync (the
    kernel keeps dirty pages, such as those of files just generated)."""
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def resident_fraction(path):
    """The fraction of the file's pages in the page cache (mincore), or None
    where it cannot be told."""
    import ctypes
    import mmap
    try:
        size = os.path.getsize(path)
        if size == 0:
            return 0.0
        libc = ctypes.CDLL(None, use_errno=True)
        page = mmap.PAGESIZE
        # A private mapping, never written: its pages are the page cache's,
        # and ctypes can take its address.
        with open(path, "rb") as f, mmap.mmap(f.fileno(), size, access=mmap.ACCESS_COPY) as m:
            vec = (ctypes.c_ubyte * ((size + page - 1) // page))()
            view = (ctypes.c_char * 1).from_buffer(m)
            try:
                addr = ctypes.addressof(view)
                if libc.mincore(ctypes.c_void_p(addr), ctypes.c_size_t(size), vec) != 0:
                    return None
            finally:
                del view
        return float(np.frombuffer(vec, np.uint8).astype(bool).mean())
    except (OSError, ValueError, AttributeError):
        return None


# -- sources ---------------------------------------------------------------------

class ChunkedSource:
    """The chunked file (DIR/cosmoflow.h5) as a map-style dataset of
    {"x", "y"} samples, read a contiguous range at a time: what DistDataset
    loads each rank's share from."""

    def __init__(self, path):
        import h5py
        self.path = path
        with h5py.File(path, "r") as f:
            self.n = int(f["x"].shape[0])
        self._f = None
        self._pid = None

    def _file(self):
        import h5py
        if self._f is None or self._pid != os.getpid():
            self._f, self._pid = h5py.File(self.path, "r"), os.getpid()
        return self._f

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        f = self._file()
        return {"x": f["x"][i], "y": f["y"][i]}

    def __getitems__(self, indices):
        idx = list(indices)
        if not idx:
            return []
        lo, hi = idx[0], idx[-1] + 1
        if idx != list(range(lo, hi)):
            return [self[i] for i in idx]
        f = self._file()
        xs, ys = f["x"][lo:hi], f["y"][lo:hi]
        return [{"x": xs[j], "y": ys[j]} for j in range(hi - lo)]

    def close(self):
        if self._f is not None:
            self._f.close()
            self._f = None


class SampleFiles:
    """One HDF5 file per sample (DIR/files/sample_NNNNNN.h5), each opened and
    read whole by __getitem__, as SOLAR's baseline reads CosmoFlow."""

    def __init__(self, paths):
        self.paths = list(paths)

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, i):
        import h5py
        import torch
        with h5py.File(self.paths[i], "r") as f:
            x, y = f["x"][:], f["y"][:]
        return torch.from_numpy(x), torch.from_numpy(y)


def permutation_sampler():
    """The class PermutationSampler (defined on first use: torch is imported
    only by the jobs that run a loader)."""
    from torch.utils.data import DistributedSampler

    class PermutationSampler(DistributedSampler):
        """DistributedSampler with ddstore's permutation of (seed, epoch)
        instead of torch.randperm: the same padding or dropping, the same
        positions per rank (rank r takes r, r+P, r+2P, ...)."""

        def __iter__(self):
            idx = permutation(self.seed, self.epoch, len(self.dataset)).tolist()
            if self.drop_last:
                idx = idx[:self.total_size]
            else:
                pad = self.total_size - len(idx)
                while pad > 0:
                    idx += idx[:pad]
                    pad = self.total_size - len(idx)
            return iter(idx[self.rank:self.total_size:self.num_replicas])

    return PermutationSampler


# -- the loaders -----------------------------------------------------------------

class _Loader:
    """What the job asks of a loader; cfg holds the job's parameters
    (batch, seed, epochs, capacity, workers, prefetch) and paths."""

    name = ""

    def __init__(self, cfg, store, ranks, rank):
        self.cfg, self.store, self.ranks, self.rank = cfg, store, ranks, rank
        self._stats = {"samples": 0, "storage": 0, "hits": 0, "missing": 0}

    def _backing(self):
        """The chunked file's datasets, as DistDataset's backing of the
        fields x and y."""
        h5 = self.cfg["chunked"]
        return {"x": f"{h5}:/x", "y": f"{h5}:/y"}

    def setup(self):
        """Collective: whatever is loaded before the first epoch."""

    def prepare(self, e):
        """Before epoch e, outside its timing: plan it (the schedule is
        known before the epoch, as in SOLAR, whose planning is offline)."""

    def epoch(self, e):
        raise NotImplementedError

    def promised(self, e):
        raise NotImplementedError

    def take_stats(self):
        """Counts since the last call: samples handed out, samples read from
        storage, samples served from memory, buffer hits missing."""
        s, self._stats = self._stats, {k: 0 for k in self._stats}
        return s

    def close(self):
        pass


class Baseline(_Loader):
    name = "baseline"

    def setup(self):
        from torch.utils.data import DataLoader
        c = self.cfg
        self.ds = SampleFiles(c["files"])
        self.sampler = permutation_sampler()(self.ds, num_replicas=self.ranks, rank=self.rank, shuffle=True,
                                              seed=c["seed"], drop_last=True)
        self.loader = DataLoader(self.ds, batch_size=c["batch"], sampler=self.sampler, drop_last=True,
                                 num_workers=c["workers"])

    def epoch(self, e):
        self.sampler.set_epoch(e)
        for x, y in self.loader:
            n = x.shape[0]
            self._stats["samples"] += n
            self._stats["storage"] += n  # every sample from its file
            yield x, y

    def promised(self, e):
        self.sampler.set_epoch(e)
        b = self.cfg["batch"]
        idx = list(self.sampler)
        return np.asarray(idx[:len(idx) // b * b], np.int64)


class _Stored(_Loader):
    """DistDataset + ScheduledSampler + ThreadDataLoader: ddstore and
    ddstore-locality."""

    policy = "random"
    policy_capacity = None  # None: the whole set in memory

    def setup(self):
        from ddstore.torch import DistDataset, ScheduledSampler, ThreadDataLoader
        c = self.cfg
        self.var = f"cosmoflow-{self.name}"
        src = ChunkedSource(c["chunked"])
        cap = self.policy_capacity
        kw = {} if cap is None else {"capacity": cap, "backing": self._backing()}
        try:
            self.ds = DistDataset(src, self.var, store=self.store, chunk_size=c["load_chunk"], **kw)
        finally:
            src.close()
        self.sampler = ScheduledSampler(self.ds, c["batch"], seed=c["seed"], policy=self.policy, capacity=cap,
                                        drop_last=True, epochs=c["epochs"],
                                        prefetch=c["prefetch"] if cap is not None else 0)
        self.loader = ThreadDataLoader(self.ds, batch_sampler=self.sampler, num_workers=c["workers"],
                                       reuse_buffers="lend")
        self._prof = self._profile()

    def _profile(self):
        p = self.store.get_profile(f"{self.var}/x")
        return p["rows"], p["storage_rows"]

    def prepare(self, e):
        self.sampler.set_epoch(e)
        self.sampler.plan(e, hits=False)  # cached for the iteration

    def epoch(self, e):
        self.sampler.set_epoch(e)
        for b in self.loader:
            yield b["x"], b["y"]
        rows, storage = self._profile()
        d_rows, d_storage = rows - self._prof[0], storage - self._prof[1]
        self._prof = (rows, storage)
        self._stats["samples"] += d_rows
        self._stats["storage"] += d_storage
        self._stats["hits"] += d_rows - d_storage

    def promised(self, e):
        return self.sampler.plan(e, hits=False).samples.copy()

    def close(self):
        self.ds.free()


class InMemory(_Stored):
    name = "ddstore"


class Locality(_Stored):
    name = "ddstore-locality"
    policy = "locality"

    def __init__(self, cfg, store, ranks, rank):
        super().__init__(cfg, store, ranks, rank)
        self.policy_capacity = cfg["capacity"]


class FifoBuffer:
    """A rank's FIFO buffer of c samples, as internal/schedule's fifo keeps
    it: a read that misses stores the sample, evicting the oldest; a hit
    changes nothing. slot maps a sample to the slot of its newest copy."""

    def __init__(self, c, xshape, xdtype, yshape, ydtype):
        self.c = c
        self.x = np.empty((c, *xshape), xdtype)
        self.y = np.empty((c, *yshape), ydtype)
        self.held = np.full(c, -1, np.int64)
        self.slot = {}
        self.next = 0

    def lookup(self, i):
        return self.slot.get(int(i))

    def store(self, i, x, y):
        k = self.next
        old = int(self.held[k])
        if old >= 0 and self.slot.get(old) == k:
            del self.slot[old]
        self.x[k], self.y[k], self.held[k] = x, y, i
        self.slot[int(i)] = k
        self.next = (k + 1) % self.c


class Solar(_Loader):
    name = "ddstore-solar"

    def setup(self):
        from ddstore.torch import DistDataset, ScheduledSampler
        c = self.cfg
        self.var = f"cosmoflow-{self.name}"
        src = ChunkedSource(c["chunked"])
        try:
            sample = src[0]
            # Nothing in the job's memory: every read the buffers miss goes
            # to the file, through the agent.
            self.ds = DistDataset(src, self.var, store=self.store, capacity=0, backing=self._backing())
        finally:
            src.close()
        self.sampler = ScheduledSampler(self.ds, c["batch"], seed=c["seed"], policy="solar", capacity=c["capacity"],
                                        drop_last=True, epochs=c["epochs"], prefetch=0)
        self.xshape, self.xdtype = sample["x"].shape, sample["x"].dtype
        self.yshape, self.ydtype = sample["y"].shape, sample["y"].dtype
        self.buf = FifoBuffer(c["capacity"] // self.ranks, self.xshape, self.xdtype, self.yshape, self.ydtype)
        self._rows = 0
        self._alloc(c["batch"])

    def _alloc(self, n):
        if self._rows < n:
            self.xb = np.empty((n, *self.xshape), self.xdtype)
            self.yb = np.empty((n, *self.yshape), self.ydtype)
            self.xr = np.empty((n, *self.xshape), self.xdtype)
            self.yr = np.empty((n, *self.yshape), self.ydtype)
            self._rows = n

    def _read(self, idx):
        """Samples idx from the store (the file, through the agent) into the
        scratch rows xr, yr."""
        m = idx.shape[0]
        self.store.get_batch(f"{self.var}/x", self.xr[:m], idx)
        self.store.get_batch(f"{self.var}/y", self.yr[:m], idx)
        return self.xr[:m], self.yr[:m]

    def prepare(self, e):
        self.sampler.plan(e)  # with hits; cached

    def epoch(self, e):
        import torch
        c = self.cfg
        plan = self.sampler.plan(e)
        steps = plan.steps
        # Steps SOLAR re-deals (each epoch after the first): their hits are
        # looked up, their storage reads are staged for the step, not kept.
        redealt = min(c["capacity"] // (c["batch"] * self.ranks), steps) if e > 0 else 0
        ahead = c["prefetch"]

        def announce(s):
            reads = plan.storage_reads(s)
            if reads.size:
                self.ds.prefetch(reads)

        for s in range(min(ahead, steps)):
            announce(s)
        self._alloc(int(plan.sizes.max()) if steps else 0)
        buf, st = self.buf, self._stats
        for s in range(steps):
            if ahead and s + ahead < steps:
                announce(s + ahead)
            lo, hi = plan.offsets[s], plan.offsets[s + 1]
            b, h = plan.samples[lo:hi], plan.hits[lo:hi]
            n = b.shape[0]
            xb, yb = self.xb[:n], self.yb[:n]
            miss = np.flatnonzero(~h)
            xr, yr = self._read(b[miss]) if miss.size else (None, None)
            keep = s >= redealt
            late = []
            # In the plan's order, as the simulation reads: a hit is looked up
            # in the buffer as it is then, a miss is stored (evicting).
            r = 0
            for j in range(n):
                if h[j]:
                    k = buf.lookup(b[j])
                    if k is None:
                        late.append(j)
                    else:
                        xb[j], yb[j] = buf.x[k], buf.y[k]
                else:
                    xb[j], yb[j] = xr[r], yr[r]
                    r += 1
                    if keep:
                        buf.store(b[j], xb[j], yb[j])
            if late:
                lj = np.asarray(late)
                xl, yl = self._read(b[lj])
                xb[lj], yb[lj] = xl, yl
                st["missing"] += len(late)
            st["samples"] += n
            st["storage"] += miss.size + len(late)
            st["hits"] += n - miss.size - len(late)
            yield torch.from_numpy(xb), torch.from_numpy(yb)

    def promised(self, e):
        return self.sampler.plan(e, hits=False).samples.copy()

    def epoch_order(self):
        """The permutation each epoch ran (SOLAR reorders them): epoch k
        drew ddstore.schedule.permutation(seed, order[k], N)."""
        import json
        import subprocess
        sp, order = self.sampler, []
        for e in range(self.cfg["epochs"]):
            args = [sp.binary, "schedule", "--n", str(sp.n), "--ranks", str(sp.ranks), "--ranks-per-node",
                    str(sp.ranks_per_node), "--batch", str(sp.batch_size), "--epochs", str(sp.epochs),
                    "--capacity", str(sp.capacity), "--policy", "solar", "--seed", str(sp.seed), "--drop-last",
                    "--emit-rank", "0", "--epoch", str(e), "--json"]
            r = subprocess.run(args, capture_output=True, text=True)
            try:
                order.append(int(json.loads(r.stdout)["perm"]))
            except (ValueError, KeyError):
                return None
        return order

    def close(self):
        self.ds.free()


_CLASSES = {c.name: c for c in (Baseline, InMemory, Solar, Locality)}


def make_loader(name, cfg, store, ranks, rank):
    return _CLASSES[name](cfg, store, ranks, rank)
