"""ScheduledSampler: a torch batch sampler that reads the plan of `ddstore schedule`
(internal/schedule, the one implementation of the policies) instead of
dealing samples itself, and resumes mid-epoch exactly.

    from ddstore.torch import DistDataset, ScheduledSampler, ThreadDataLoader

    ds = DistDataset(source, "train")
    sampler = ScheduledSampler(ds, batch_size=32, seed=7)      # policy "locality"
    loader = ThreadDataLoader(ds, batch_sampler=sampler, num_workers=4)
    for epoch in range(start_epoch, epochs):
        sampler.set_epoch(epoch)
        for batch in loader:
            train(batch)
            sampler.consumed()              # one more batch done (see below)
            if time_to_checkpoint:
                save({"model": ..., "sampler": sampler.state_dict()})

    # after a restart, with any number of loader workers:
    sampler.load_state_dict(ckpt["sampler"])   # the loop above then goes on
                                               # from the saved epoch and step

What each rank reads comes from the `ddstore` binary (`ddstore schedule
--emit-rank R --epoch E`, see `ddstore schedule --help`), run once per epoch
the sampler needs; the current epoch's plan is cached. The job's geometry is
n = len(dataset), ranks and this rank from the dataset's store (DistDataset,
DistDatasetReader, or anything with a `.store`, also through `.ds` or
`.dataset`), ranks per node from the store's local_size; pass rank, ranks and
ranks_per_node to override (without a store: torch.distributed when it is
initialized, else one rank). Nodes are taken to hold consecutive ranks, as
DistDataset's layout does.

Steps and resuming. A batch sampler is iterated in the main process: loader
workers, threads or processes, only read the batches it yields, in its order,
so the number of workers never changes which samples a rank gets. But a
loader asks for batches ahead of the training loop (prefetching), so the
number of batches the sampler has yielded runs ahead of the number the loop
has trained on. state_dict()["step"] is, in this order of preference: the
`step` passed to state_dict(step=...); the batches counted by consumed() in
this epoch (plus the step the epoch resumed from); the batches yielded in this
epoch. With a prefetching loader, call consumed() after each trained batch or
pass step, or take ThreadDataLoader's state_dict(), which counts the batches
the loop got; with a plain loop over the sampler, neither is needed.

The state (format 2, small and JSON-serialisable) also holds the position:
the samples of the epoch's global order (its permutation, padded) that the
saved steps delivered, the same number on every rank. load_state_dict(d,
step=None) checks that d is of the same dataset (name, n, row sizes), seed
and rules (policy, drop_last, pin; under solar also what orders the epochs),
raising ValueError naming the field and both values otherwise. Then, on the
same geometry (ranks, ranks_per_node, batch_size, capacity) the saved plan
goes on at its step (or `step`); on another, a job of any number of ranks or
local batch, the samples of the epoch not yet delivered are dealt over this
job's ranks, each once (`ddstore schedule --resume-epoch E --resume-position
X`), and later epochs are those of a job of this geometry. The next
iteration starts there; set_epoch with the same epoch keeps it, another
epoch starts at 0, an epoch before the one a run resumed in is an error.

Rows of different sizes. With sizes (every sample's bytes, or the name of
a ragged variable of the dataset's store, whose row sizes the store tells:
ragged_sizes times the bytes of a unit), memory is a budget of
capacity_bytes bytes instead of capacity samples:

    sampler = ScheduledSampler(ds, batch_size=32, sizes="atoms", capacity_bytes=8 << 30)

The binary gets the sizes on stdin (`ddstore schedule --sizes -
--capacity-bytes M`): locality pins rows filling the budget and deals
storage reads by bytes, and each EpochPlan has its steps' bytes
(plan.bytes, plan.storage_bytes).
"""

import hashlib
import io

import numpy as np
from torch.utils.data import Sampler

from .. import _agent
from ..sampler import _MAX_SAMPLES, _MAX_SEED, POLICIES, EpochPlan, _bad, _int, read_plan

__all__ = ["ScheduledSampler", "EpochPlan"]

# The state keys that fix the deal, per policy: a state saved under other
# values describes another plan. random deals by position alone; locality
# also pins `capacity` samples over nodes of ranks_per_node ranks; solar
# re-deals by its buffers (capacity) and orders the job's epochs with a swarm.
_SAME = ("n", "ranks", "batch_size", "policy", "drop_last")
# Under a byte budget the pinned rows (locality) and the buffers' contents
# (solar's re-deal) depend on the budget and the sizes too (a digest of them).
_SAME_BY_POLICY = {
    "random": _SAME,
    "locality": _SAME + ("capacity", "ranks_per_node", "capacity_bytes", "sizes", "pin"),
    "solar": _SAME + ("capacity", "epochs", "swarm_population", "swarm_iterations", "capacity_bytes", "sizes"),
}
PINS = ("bytes", "samples")

#: The format of state_dict(): 2 carries the position in the epoch's global
#: order, which resumes on any number of ranks; 1 (no "format" key) is the
#: step of a plan, which resumes on the same ranks only.
STATE_FORMAT = 2
# What a state must agree on with the sampler loading it: the same dataset
# (name when both know one, length, row sizes), seed and rules of the
# global order (policy, drop_last, pin). Under solar also what orders the
# job's epochs. What may differ, the deal's geometry, decides whether the
# saved plan goes on (all equal) or the positions left are dealt anew.
_IDENTITY = ("dataset", "n", "seed", "policy", "drop_last", "sizes", "pin")
_SOLAR_ORDER = ("epochs", "capacity", "capacity_bytes", "swarm_population", "swarm_iterations")
_GEOMETRY = ("ranks", "ranks_per_node", "batch_size", "capacity", "capacity_bytes")
_KEYS_V2 = ("format", "epoch", "step", "position", "run_start", "order_ranks") + _IDENTITY + _SOLAR_ORDER + _GEOMETRY


def _dataset_name(dataset):
    """The name of a store-backed dataset (DistDataset, DistDatasetReader,
    also through wrappers), None if it has none."""
    for d in (dataset, getattr(dataset, "ds", None), getattr(dataset, "dataset", None)):
        name = getattr(d, "name", None)
        if isinstance(name, str) and getattr(d, "store", None) is not None:
            return name
    return None


class _Pass:
    """One iteration of a batch sampler of this package: its batches, and
    the sampler's state after any number of them (state_at), which a loader
    that fetches ahead asks for with the count it delivered. state_dict /
    load_state_dict: the protocol of torchdata's StatefulDataLoader, which
    saves the iterator of the sampler it runs."""

    def __init__(self, sampler, start, gen):
        self._sampler, self.start, self._gen, self.yielded = sampler, start, gen, 0

    def __iter__(self):
        return self

    def __next__(self):
        b = next(self._gen)
        self.yielded += 1
        return b

    def state_at(self, done):
        """The sampler's state once `done` batches of this pass are trained."""
        return self._sampler.state_dict(step=self.start + done)

    def state_dict(self):
        return self.state_at(self.yielded)

    def load_state_dict(self, state):
        self._sampler.load_state_dict(state)
        fresh = iter(self._sampler)
        self.start, self._gen, self.yielded = fresh.start, fresh._gen, 0


def _sizes_of(dataset, sizes, n):
    """Every sample's bytes as int64: sizes itself (array-like of n
    integers), or, for the name of a ragged variable of the dataset's store,
    its rows' lengths times the bytes of a unit."""
    if isinstance(sizes, str):
        store = _find_store(dataset)
        if store is None or not hasattr(store, "ragged_sizes"):
            raise _bad(f"sizes {sizes!r}: a variable's name needs a store-backed dataset; pass the sizes")
        _, disp, itemsize = store.info(sizes)
        return np.asarray(store.ragged_sizes(sizes, np.arange(n, dtype=np.int64)), dtype=np.int64) * (disp * itemsize)
    try:
        a = np.asarray(sizes)
    except Exception:  # noqa: BLE001 - anything numpy cannot read is the caller's bad value
        raise _bad(f"sizes of type {type(sizes).__name__}: want an array of {n} integers") from None
    if a.ndim != 1 or a.shape[0] != n:
        raise _bad(f"sizes of shape {list(a.shape)}: want one size per sample, shape [{n}]")
    if a.dtype.kind not in "iu":
        raise _bad(f"sizes of dtype {a.dtype}: want integers (bytes)")
    if a.dtype.kind == "u" and a.size and int(a.max()) > 2**63 - 1:
        raise _bad(f"sizes: {int(a.max())} bytes is above {2**63 - 1}")
    a = a.astype(np.int64, copy=False)
    if a.size and int(a.min()) < 0:
        i = int(np.argmin(a))
        raise _bad(f"sizes[{i}] = {int(a[i])}: want a size in bytes, >= 0")
    return a


def _find_store(dataset):
    """The store of a store-backed dataset, looking through the wrappers of
    this package (WindowedDataset's .ds) and torch's (Subset's .dataset)."""
    d = dataset
    for _ in range(8):
        store = getattr(d, "store", None)
        if store is not None and hasattr(store, "rank") and hasattr(store, "size"):
            return store
        nxt = getattr(d, "ds", None)
        if nxt is None:
            nxt = getattr(d, "dataset", None)
        if nxt is None or nxt is d:
            return None
        d = nxt
    return None


def _identity(dataset):
    """(rank, ranks, ranks per node) of this process, or None for each part
    nothing tells."""
    store = _find_store(dataset)
    if store is not None:
        return store.rank, store.size, getattr(store, "local_size", None)
    try:
        import torch.distributed as dist
        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size(), None
    except ImportError:  # pragma: no cover
        pass
    return None, None, None


class _Steps:
    """The step count the batch samplers of this package share: the step
    the next pass starts from, the batches of the epoch a pass yielded, and
    those a loader counted as trained on (consumed), which state_dict
    saves. A sampler names its own errors (_error, _check_int)."""

    _error = staticmethod(_bad)
    _check_int = staticmethod(_int)

    def _reset_steps(self, start=0):
        """A new epoch or a loaded state: the next pass starts at `start`."""
        self._start, self._pos, self._consumed, self._pass_start = start, None, None, start

    def _begin_pass(self):
        """A pass starts: its first step, and the token its batches carry
        (a newer pass makes an older one's progress count no more)."""
        start = self._start
        self._start, self._pos, self._consumed, self._pass_start = 0, start, None, start
        token = self._token = object()
        return start, token

    def _saved_step(self):
        """The step state_dict saves when not told: those counted by
        consumed(), else those yielded, else where the next pass starts."""
        return next(v for v in (self._consumed, self._pos, self._start) if v is not None)

    def consumed(self, k=1):
        """Count k more batches of this epoch as trained on; state_dict()
        then saves that count (plus the step this pass resumed from) rather
        than what the sampler yielded, which a prefetching loader runs ahead
        of. A new pass (iter) or another epoch starts the count again."""
        k = self._check_int("k", k, 0)
        pos = self._pos if self._pos is not None else self._start
        done = (self._consumed if self._consumed is not None else self._pass_start) + k
        if done > pos:
            raise self._error(f"consumed {done} batches of epoch {self._epoch}, only {pos} yielded")
        self._consumed = done


class ScheduledSampler(_Steps, Sampler):
    """A batch sampler (DataLoader(batch_sampler=...), ThreadDataLoader
    likewise) yielding this rank's batches, lists of dataset indices, under a
    schedule of `ddstore schedule`.

    dataset: a DistDataset, DistDatasetReader or other store-backed dataset
    (n = len(dataset); an int is taken as n). batch_size: B, samples per rank
    per step. seed: the seed of every epoch's order, [0, 2**64). policy:
    "locality" (every rank exactly B a step, memory hits read on the node
    holding them), "random" (PyTorch's DistributedSampler deal with
    ddstore's permutation) or "solar" (SOLAR: epochs reordered, unequal local
    batches). capacity: samples the job holds in memory (default n: all of
    them). drop_last: drop what does not fill whole batches (for random,
    DistributedSampler's and DataLoader's drop_last) instead of padding with
    the epoch's first samples. epochs: the job's epochs; solar needs it (it
    orders them all), the others check set_epoch against it when given.
    rank, ranks, ranks_per_node: override what the dataset's store says.
    swarm_population, swarm_iterations: solar's swarm (None: the defaults).
    binary: the ddstore binary (default: DDSTORE_BIN, the bundled one, PATH).
    prefetch: steps ahead whose samples are announced to the dataset's
    prefetch() as batches are yielded (a DistDataset with backing files reads
    those only the files hold into its agent's staging memory); 0 turns it
    off. Datasets without prefetch() are left alone.
    sizes: rows of different sizes: every sample's bytes (an array of n
    integers), or the name of a ragged variable of the dataset's store.
    Memory is then capacity_bytes bytes (default: the dataset's, all of
    it) instead of capacity samples, which must be left None. pin (with
    sizes, locality): what the pinned rows maximise, "bytes" (a prefix of
    the rows filling the budget, the default) or "samples" (the smallest).

    Bad values raise ValueError (ddstore.ArgumentError) naming them; the
    binary checks the combination once, at construction.
    """

    def __init__(self, dataset, batch_size, seed=0, policy="locality", capacity=None, drop_last=False, epochs=None,
                 rank=None, ranks=None, ranks_per_node=None, swarm_population=None, swarm_iterations=None,
                 binary=None, prefetch=2, sizes=None, capacity_bytes=None, pin=None):
        if isinstance(dataset, (bool, np.bool_)):
            raise _bad(f"dataset {dataset!r}: want a dataset or a number of samples")
        if isinstance(dataset, (int, np.integer)):
            n = _int("n", dataset, 1, _MAX_SAMPLES)
        else:
            try:
                n = len(dataset)
            except TypeError:
                raise _bad(f"dataset of type {type(dataset).__name__}: it has no len()") from None
            if n < 1:
                raise _bad(f"n {n}: the dataset is empty")
            n = _int("n", n, 1, _MAX_SAMPLES)
        if not isinstance(policy, str) or policy not in POLICIES:
            raise _bad(f"policy {policy!r}: want one of {', '.join(repr(p) for p in POLICIES)}")
        self.n, self.policy = n, policy
        self.batch_size = _int("batch_size", batch_size, 1)
        self.seed = _int("seed", seed, 0, _MAX_SEED)
        self._sizes_npy, self.sizes_digest, self.capacity_bytes, self.pin = None, None, None, None
        if sizes is None:
            if capacity_bytes is not None or pin is not None:
                raise _bad(f"{'capacity_bytes' if capacity_bytes is not None else 'pin'} goes with sizes: a byte "
                           f"budget needs every sample's size")
            self.capacity = n if capacity is None else _int("capacity", capacity, 1)
            if self.capacity > n:
                raise _bad(f"capacity {self.capacity} above n {n}: memory holds at most the whole dataset")
        else:
            if capacity is not None:
                raise _bad(f"capacity {capacity!r} with sizes: the budget is capacity_bytes (bytes), not samples")
            if pin is not None and pin not in PINS:
                raise _bad(f"pin {pin!r}: want one of {', '.join(repr(p) for p in PINS)}")
            sz = _sizes_of(dataset, sizes, n)
            total = int(sz.sum())
            if total < 1:
                raise _bad(f"sizes of {n} samples add up to {total} bytes")
            self.capacity = None
            self.capacity_bytes = total if capacity_bytes is None else _int("capacity_bytes", capacity_bytes, 1)
            if self.capacity_bytes > total:
                raise _bad(f"capacity_bytes {self.capacity_bytes} above the dataset's {total} bytes: memory holds at "
                           f"most the whole dataset")
            self.pin = pin if pin is not None else "bytes"
            buf = io.BytesIO()
            np.save(buf, sz)
            self._sizes_npy = buf.getvalue()
            self.sizes_digest = hashlib.sha256(sz.tobytes()).hexdigest()[:16]
        if not isinstance(drop_last, (bool, np.bool_)):
            raise _bad(f"drop_last {drop_last!r}: want True or False")
        self.drop_last = bool(drop_last)
        self.epochs = None if epochs is None else _int("epochs", epochs, 1)
        if policy == "solar" and self.epochs is None:
            raise _bad("policy 'solar' orders all the job's epochs: pass epochs")
        srank, sranks, slocal = _identity(dataset)
        ranks = sranks if ranks is None else ranks
        self.ranks = 1 if ranks is None else _int("ranks", ranks, 1)
        rank = srank if rank is None else rank
        self.rank = 0 if rank is None else _int("rank", rank, 0)
        if self.rank >= self.ranks:
            raise _bad(f"rank {self.rank} not in [0, {self.ranks}): ranks {self.ranks}")
        if ranks_per_node is None:
            ranks_per_node = slocal if slocal and self.ranks % slocal == 0 else 1
        self.ranks_per_node = _int("ranks_per_node", ranks_per_node, 1)
        if self.ranks % self.ranks_per_node:
            raise _bad(f"ranks_per_node {self.ranks_per_node} does not divide ranks {self.ranks}")
        if self.batch_size * self.ranks > n:
            raise _bad(f"batch_size {self.batch_size} × ranks {self.ranks} = {self.batch_size * self.ranks} above "
                       f"n {n}: not one global batch")
        self.swarm_population = None if swarm_population is None else _int("swarm_population", swarm_population, 0)
        self.swarm_iterations = None if swarm_iterations is None else _int("swarm_iterations", swarm_iterations, 0)
        self.binary = binary or _agent.find_binary()
        self.prefetch = _int("prefetch", prefetch, 0)
        self._announce = getattr(dataset, "prefetch", None) if self.prefetch else None
        self._epoch = 0
        # _start: the step the next pass starts from; _pos: the batches of
        # this epoch yielded (absolute), None before a pass; _consumed: those
        # consumed, None unless counted; _pass_start: the step the current
        # pass started from; _token: the pass whose progress counts.
        self._token = None
        self._reset_steps()
        self._cache = {}
        self.dataset_name = _dataset_name(dataset)
        # A run that resumed a job on another geometry: (epoch, position)
        # where it started; under solar, the ranks that order the epochs.
        self._run_start, self.order_ranks = None, None
        # The binary checks what is left (e.g. capacity below ranks for
        # random and solar) and tells the steps per epoch.
        self._steps = self.plan(0, hits=False).steps

    # -- the plan ---------------------------------------------------------------

    def _args(self, epoch, hits=True):
        epochs = self.epochs if self.epochs is not None else epoch + 1
        if self._sizes_npy is None:
            budget = ["--capacity", str(self.capacity)]
        else:
            budget = ["--sizes", "-", "--capacity-bytes", str(self.capacity_bytes), "--pin", self.pin]
        a = [self.binary, "schedule", "--n", str(self.n), "--ranks", str(self.ranks), "--ranks-per-node",
             str(self.ranks_per_node), "--batch", str(self.batch_size), "--epochs", str(epochs)] + budget + [
             "--policy", self.policy, "--seed", str(self.seed), "--emit-rank", str(self.rank),
             "--epoch", str(epoch), "--emit-positions"] + (["--emit-hits"] if hits else [])
        if self._run_start is not None:
            a += ["--resume-epoch", str(self._run_start[0]), "--resume-position", str(self._run_start[1])]
        if self.order_ranks is not None:
            a += ["--order-ranks", str(self.order_ranks)]
        if self.drop_last:
            a.append("--drop-last")
        if self.swarm_population is not None:
            a += ["--population", str(self.swarm_population)]
        if self.swarm_iterations is not None:
            a += ["--iterations", str(self.swarm_iterations)]
        return a

    def _check_epoch(self, epoch):
        epoch = _int("epoch", epoch, 0)
        if self.epochs is not None and epoch >= self.epochs:
            raise _bad(f"epoch {epoch} not in [0, {self.epochs}): epochs {self.epochs}")
        if self._run_start is not None and epoch < self._run_start[0]:
            raise _bad(f"epoch {epoch} before epoch {self._run_start[0]}, where this run resumed the job")
        return epoch

    def plan(self, epoch=None, hits=True):
        """This rank's EpochPlan of `epoch` (default: the current one), from
        the binary; the latest two are cached. With hits=False the plan has
        no hit flags (hits is None), which is all iterating needs and, under
        `random`, saves replaying the earlier epochs' buffers."""
        epoch = self._epoch if epoch is None else self._check_epoch(epoch)
        p = self._cache.get(epoch)
        if p is not None and (p.hits is not None or not hits):
            return p
        p = read_plan(self._args(epoch, hits), epoch, hits, nbytes=self._sizes_npy is not None,
                      stdin=self._sizes_npy, positions=True)
        while len(self._cache) >= 2:
            del self._cache[next(iter(self._cache))]
        self._cache[epoch] = p
        return p

    # -- the batch sampler --------------------------------------------------------

    @property
    def epoch(self):
        return self._epoch

    def __len__(self):
        """Steps of the current epoch, whatever step an iteration starts
        from: the same in every epoch, except the one a run resumed on
        another geometry starts in, which has the steps of the positions
        left."""
        if self._run_start is None:
            return self._steps
        return self.plan(hits=False).steps

    def set_epoch(self, epoch):
        """Make the next iteration run `epoch` (the epoch-th of the job, in
        the order the policy runs them). The same epoch as now keeps a step
        load_state_dict set; another starts at step 0."""
        epoch = self._check_epoch(epoch)
        if epoch != self._epoch:
            self._epoch = epoch
            self._reset_steps()

    def __iter__(self):
        plan = self.plan(hits=False)
        start, token = self._begin_pass()
        return _Pass(self, start, self._batches(plan, start, token))

    def _batches(self, plan, start, token):
        ahead, announce = self.prefetch, self._announce
        if announce is not None:
            for s in range(start, min(start + ahead, plan.steps)):
                announce(plan.batch(s))
        for s in range(start, plan.steps):
            if announce is not None and s + ahead < plan.steps:
                announce(plan.batch(s + ahead))
            b = plan.batch(s).tolist()
            if self._token is token:
                self._pos = s + 1
            yield b

    # -- state ----------------------------------------------------------------------

    def state_dict(self, step=None):
        """The state to save with the model, small and JSON-serialisable:
        seed, epoch, step (batches of the epoch done: `step` when given,
        else those counted by consumed(), else those yielded), position
        (the samples of the epoch's global order those steps delivered,
        which resumes on any number of ranks), the format, and what the
        plan is a function of."""
        if step is None:
            step = self._saved_step()
        else:
            step = self._check_step(step)
        position = int(self.plan(hits=False).positions[step])
        order_ranks = (self.order_ranks or self.ranks) if self.policy == "solar" else None
        return {"format": STATE_FORMAT, "dataset": self.dataset_name, "seed": self.seed, "epoch": self._epoch,
                "step": int(step), "position": position, "policy": self.policy, "capacity": self.capacity,
                "n": self.n, "ranks": self.ranks, "batch_size": self.batch_size, "drop_last": self.drop_last,
                "ranks_per_node": self.ranks_per_node, "epochs": self.epochs,
                "swarm_population": self.swarm_population, "swarm_iterations": self.swarm_iterations,
                "capacity_bytes": self.capacity_bytes, "sizes": self.sizes_digest, "pin": self.pin,
                "run_start": None if self._run_start is None else list(self._run_start), "order_ranks": order_ranks}

    def _check_step(self, step, epoch=None):
        step = _int("step", step, 0)
        steps = self.plan(epoch, hits=False).steps
        if step > steps:
            raise _bad(f"step {step} above the {steps} steps of epoch {self._epoch if epoch is None else epoch}")
        return step

    def _set_run(self, run_start, order_ranks):
        run_start = None if run_start is None else tuple(run_start)
        if (run_start, order_ranks) != (self._run_start, self.order_ranks):
            self._run_start, self.order_ranks, self._cache = run_start, order_ranks, {}

    def load_state_dict(self, state, step=None):
        """Resume from `state` (state_dict() of a sampler over the same
        dataset and seed, on any rank of a job of any number of ranks). On
        the same geometry (ranks, ranks_per_node, batch_size, capacity) the
        saved plan goes on at the saved step (or `step`), exactly the
        batches an uninterrupted run would have yielded. On another one the
        samples of the epoch not yet delivered (from its position) are
        dealt over this job's ranks, every one once, every rank the same
        number of steps; later epochs are those of a job of this geometry.
        A state of another dataset, seed, length, policy or format raises
        ValueError naming the field and both values."""
        if not isinstance(state, dict):
            raise _bad(f"state of type {type(state).__name__}: want the dict of state_dict()")
        fmt = state.get("format", 1)
        if fmt not in (1, STATE_FORMAT) or isinstance(fmt, bool):
            raise _bad(f"format {fmt!r} in the state: want 1 or {STATE_FORMAT}, the formats this sampler reads")
        if fmt == 1:
            return self._load_v1(state, step)
        missing = [k for k in _KEYS_V2 if k not in state]
        if missing:
            raise _bad(f"state without {', '.join(missing)}: want the dict of state_dict()")
        mine = self._identity_state()
        same = _IDENTITY + (_SOLAR_ORDER if self.policy == "solar" else ())
        for k in same:
            if k == "dataset" and (state[k] is None or mine[k] is None):
                continue  # a dataset without a name (a number of samples) is told by n
            if state[k] != mine[k]:
                raise _bad(f"{k} {state[k]!r} in the state, {mine[k]!r} here: the state is of another "
                           f"{'dataset' if k in ('dataset', 'n', 'sizes') else 'order'}")
        epoch = self._check_epoch_of(state["epoch"])
        position = _int("position", state["position"], 0, self.n)
        order_ranks = None
        if self.policy == "solar":
            order_ranks = _int("order_ranks", state["order_ranks"] or state["ranks"], 1)
        run_start = state["run_start"]
        if run_start is not None:
            if not isinstance(run_start, (list, tuple)) or len(run_start) != 2:
                raise _bad(f"run_start {run_start!r} in the state: want [epoch, position] or None")
            run_start = (_int("run_start epoch", run_start[0], 0, epoch), _int("run_start position", run_start[1],
                                                                               0, self.n))
        k = None
        if all(state[g] == mine[g] for g in _GEOMETRY):
            self._set_run(run_start, order_ranks)
            k = self._check_step(state["step"] if step is None else step, epoch)
            if step is None and int(self.plan(epoch, hits=False).positions[k]) != position:
                raise _bad(f"step {k} and position {position} in the state disagree: step {k} of epoch {epoch} "
                           f"ends at position {int(self.plan(epoch, hits=False).positions[k])}")
        elif step is not None:
            diff = next(g for g in _GEOMETRY if state[g] != mine[g])
            raise _bad(f"step {step!r} with a state of {diff} {state[diff]!r} ({mine[diff]!r} here): a step is of "
                       f"the saved plan; on another geometry the state's position resumes")
        if k is None:  # the positions left, dealt over this job
            self._set_run((epoch, position), order_ranks)
            k = 0
        self._epoch, self._token = epoch, None
        self._reset_steps(k)

    def _check_epoch_of(self, epoch):
        epoch = _int("epoch", epoch, 0)
        if self.epochs is not None and epoch >= self.epochs:
            raise _bad(f"epoch {epoch} not in [0, {self.epochs}): epochs {self.epochs}")
        return epoch

    def _identity_state(self):
        return {"dataset": self.dataset_name, "n": self.n, "seed": self.seed, "policy": self.policy,
                "drop_last": self.drop_last, "sizes": self.sizes_digest, "pin": self.pin, "epochs": self.epochs,
                "capacity": self.capacity, "capacity_bytes": self.capacity_bytes,
                "swarm_population": self.swarm_population, "swarm_iterations": self.swarm_iterations,
                "ranks": self.ranks, "ranks_per_node": self.ranks_per_node, "batch_size": self.batch_size}

    def _load_v1(self, state, step):
        """A state of format 1 (seed, epoch, step of a plan): it resumes
        the same plan only."""
        missing = [k for k in ("seed", "epoch", "step", "policy", "capacity", "n", "ranks", "batch_size")
                   if k not in state]
        if missing:
            raise _bad(f"state without {', '.join(missing)}: want the dict of state_dict()")
        mine = {**self._identity_state(), "epochs": self.epochs}
        for k in ("seed",) + _SAME_BY_POLICY.get(state["policy"], _SAME):
            if k in state and state[k] != mine.get(k, None):
                raise _bad(f"{k} {state[k]!r} in the state, {mine.get(k)!r} here: the state is of another plan")
        epoch = self._check_epoch_of(state["epoch"])
        self._set_run(None, None)
        k = self._check_step(state["step"] if step is None else step, epoch)
        self._epoch, self._token = epoch, None
        self._reset_steps(k)

    def __repr__(self):
        budget = (f"capacity={self.capacity}" if self.capacity_bytes is None else
                  f"capacity_bytes={self.capacity_bytes}, pin={self.pin!r}")
        return (f"ScheduledSampler(n={self.n}, batch_size={self.batch_size}, policy={self.policy!r}, "
                f"{budget}, rank={self.rank}/{self.ranks}, ranks_per_node={self.ranks_per_node}, "
                f"seed={self.seed}, epoch={self._epoch})")
