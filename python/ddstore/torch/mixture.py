"""Mixtures of datasets: MixtureDataset (several datasets of the same
fields as one, index o_k + i being sample i of source k) and MixtureSampler
(a batch sampler drawing every step a fixed share of each rank's batch from
each source, by weights or by counts per epoch, deterministic from the seed,
resumable on any number of ranks).

    from ddstore.torch import DistDataset, MixtureDataset, MixtureSampler, ThreadDataLoader

    web, code = DistDataset(a, "web"), DistDataset(b, "code")
    mix = MixtureDataset([web, code])
    sampler = MixtureSampler(mix, batch_size=32, weights=[0.75, 0.25], seed=7)
    loader = ThreadDataLoader(mix, batch_sampler=sampler, num_workers=4)
    for epoch in range(start_epoch, epochs):
        sampler.set_epoch(epoch)
        for batch in loader:        # 24 samples of web, 8 of code, every rank, every step
            train(batch)
        print(sampler.counts(epoch))   # {"web": ..., "code": ...}: samples of the epoch, all ranks
    # loader.state_dict() / load_state_dict(): resumes on any number of ranks

How a step is drawn: each rank's batch of B holds b_k samples of source k,
b_k the largest-remainder share of B by the weights (counts: b_k = B c_k / Σ
c, which must come out whole). Without replacement, source k's samples come
from its own ScheduledSampler (local batch b_k, the same policy, its own
seed and capacity): each source's epochs are permutations of it, every
sample once a source epoch, dealt by the schedule's policy, so under
locality each source's reads keep to the node holding them, with the
source's hit rate at its bound; a source's stream runs on from one of its
epochs to the next, whatever the mixture's epochs. With replacement, each
rank draws its b_k samples of source k uniformly, from (seed, source, epoch,
step, rank). A mixture epoch is T samples over all ranks (counts: Σ c; by
weights: as many as the sources hold, Σ n_k), ⌈T / (P B)⌉ steps; counts(e)
tells how many of each source it read.

Resuming: the state (state_dict, JSON) is the mixture's seed, epoch and
position (samples of the epoch delivered), and each source's epoch and
position in its global order. Loaded by a job of any number of ranks or
local batch, the mixture epoch goes on with the samples it has left, each
source from where it stopped, its samples not yet delivered dealt over the
new ranks, every one once.
"""

import math
import numbers
import operator

import numpy as np
import torch.utils.data as _tud
from torch.utils.data import Sampler

from .._errors import ArgumentError
from ..sampler import _MAX_SEED, _int
from .sampler import _Pass, _Steps, ScheduledSampler, _dataset_name, _identity

__all__ = ["MixtureDataset", "MixtureSampler"]

STATE_FORMAT = 1
_MASK = 2**64 - 1
_GOLDEN = 0x9E3779B97F4A7C15  # each source's seed: the mixture's plus (k+1) of these, mod 2**64


def _bad(msg):
    return ArgumentError(f"ddstore: bad argument: MixtureSampler: {msg}")


def _bad_d(msg):
    return ArgumentError(f"ddstore: bad argument: MixtureDataset: {msg}")


def _fields_of(ds):
    """[(key, shape, dtype, layout)] of a dataset of this package, [] of
    another one (its fields are not known)."""
    schema = getattr(ds, "_schema", None)
    if schema is None:
        return None
    return [(f.key, tuple(f.shape), str(f.dtype), f.layout) for f in schema.fields]


class MixtureDataset(_tud.Dataset):
    """Several datasets as one: index offsets[k] + i is sample i of
    sources[k]. The sources must hold the same fields: of datasets of this
    package (DistDataset, DistDatasetReader) the same keys, sample shapes
    (but the varying axis of a ragged field), dtypes and layouts, checked
    here with an error naming the source, the field and both values.
    names: one per source (default: the datasets' names, else source0, ...)."""

    def __init__(self, sources, names=None):
        if isinstance(sources, (str, bytes)) or not hasattr(sources, "__len__") or len(sources) == 0:
            raise _bad_d(f"sources {sources!r}: want a list of one dataset or more")
        self.sources = list(sources)
        lens = []
        for k, ds in enumerate(self.sources):
            try:
                lens.append(len(ds))
            except TypeError:
                raise _bad_d(f"source {k} of type {type(ds).__name__}: it has no len()") from None
            if lens[-1] < 1:
                raise _bad_d(f"source {k}: empty")
        if names is None:
            names = [_dataset_name(ds) or getattr(ds, "name", None) or f"source{k}"
                     for k, ds in enumerate(self.sources)]
            names = [n if isinstance(n, str) else f"source{k}" for k, n in enumerate(names)]
        names = [str(n) for n in names]
        if len(names) != len(self.sources):
            raise _bad_d(f"{len(names)} names for {len(self.sources)} sources")
        if len(set(names)) != len(names):
            raise _bad_d(f"names {names}: want one name per source, all different")
        self.names, self.lengths = names, lens
        self.offsets = np.concatenate(([0], np.cumsum(lens))).astype(np.int64)
        first = _fields_of(self.sources[0])
        for k, ds in enumerate(self.sources[1:], 1):
            fk = _fields_of(ds)
            if first is None or fk is None:
                continue
            a, b = [f[0] for f in first], [f[0] for f in fk]
            if a != b:
                raise _bad_d(f"source {names[k]!r} has fields {b}, source {names[0]!r} {a}: the sources of a "
                             f"mixture hold the same fields")
            for (key, s0, d0, l0), (_, s1, d1, l1) in zip(first, fk):
                for what, v0, v1 in (("layout", l0, l1), ("dtype", d0, d1), ("sample shape", s0, s1)):
                    if v0 != v1:
                        raise _bad_d(f"field {key!r}: {what} {v1} in source {names[k]!r}, {v0} in source "
                                     f"{names[0]!r}: the sources of a mixture hold the same fields")

    def __len__(self):
        return int(self.offsets[-1])

    def locate(self, index):
        """(source, index within it) of a mixture index."""
        i = operator_index(index)
        if not 0 <= i < len(self):
            raise IndexError(f"mixture index {i} not in [0, {len(self)})")
        k = int(np.searchsorted(self.offsets, i, side="right")) - 1
        return k, i - int(self.offsets[k])

    def __getitem__(self, index):
        k, i = self.locate(index)
        return self.sources[k][i]

    def __getitems__(self, indices):
        """The samples of `indices`, each source's read as one batch (its
        __getitems__ where it has one), in the order asked."""
        idx = np.asarray([operator_index(i) for i in indices], dtype=np.int64)
        if idx.size and (idx.min() < 0 or idx.max() >= len(self)):
            bad = int(idx[(idx < 0) | (idx >= len(self))][0])
            raise IndexError(f"mixture index {bad} not in [0, {len(self)})")
        src = np.searchsorted(self.offsets, idx, side="right") - 1
        out = [None] * idx.size
        for k in np.unique(src).tolist():
            at = np.flatnonzero(src == k)
            local = (idx[at] - self.offsets[k]).tolist()
            ds = self.sources[k]
            getitems = getattr(ds, "__getitems__", None)
            got = getitems(local) if getitems else [ds[i] for i in local]
            for j, s in zip(at.tolist(), got):
                out[j] = s
        return out

    def prefetch(self, indices):
        """Announce mixture indices to the sources that take prefetch()."""
        idx = np.asarray(indices, dtype=np.int64)
        src = np.searchsorted(self.offsets, idx, side="right") - 1
        for k in np.unique(src).tolist():
            p = getattr(self.sources[k], "prefetch", None)
            if p is not None:
                p(idx[src == k] - self.offsets[k])

    def state_dict(self):
        return {"format": 1, "names": list(self.names), "lengths": [int(n) for n in self.lengths]}

    def load_state_dict(self, state):
        if not isinstance(state, dict) or state.get("format") != 1:
            raise _bad_d("state: want the dict of state_dict(), format 1")
        for k, mine in (("names", self.names), ("lengths", [int(n) for n in self.lengths])):
            if state.get(k) != mine:
                raise _bad_d(f"{k} {state.get(k)!r} in the state, {mine!r} here: the state is of another mixture")


def operator_index(i):
    if isinstance(i, (bool, np.bool_)):
        raise TypeError(f"mixture index {i!r}: want an integer")
    return operator.index(i)


def _shares(batch, weights):
    """The largest-remainder split of batch by weights (ties to the first)."""
    total = sum(weights)
    exact = [batch * w / total for w in weights]
    b = [math.floor(x) for x in exact]
    order = sorted(range(len(weights)), key=lambda k: (-(exact[k] - b[k]), k))
    for k in order[:batch - sum(b)]:
        b[k] += 1
    return b


class MixtureSampler(_Steps, Sampler):
    """A batch sampler over a MixtureDataset (or a list of datasets, made
    into one) yielding this rank's batches of mixture indices (see the
    module's docstring).

    weights: one number >= 0 per source (not all 0; default: the sources'
    lengths), the shares of each batch. counts: instead, the samples of each
    source per epoch (over all ranks); B c_k / Σ c must be whole and Σ c a
    multiple of ranks × batch_size. replacement: draw with replacement
    (uniform per rank) instead of each source's schedule. policy ("locality"
    or "random") and capacity (one per source, or one for all; default: the
    whole source) are those of each source's ScheduledSampler. seed: every
    source's order derives from it. rank, ranks, ranks_per_node, binary,
    prefetch: as ScheduledSampler's.
    """

    _error = staticmethod(_bad)
    _check_int = staticmethod(lambda name, v, lo, hi=None: _int_m(name, v, lo, hi))

    def __init__(self, dataset, batch_size, weights=None, counts=None, seed=0, replacement=False, policy="locality",
                 capacity=None, rank=None, ranks=None, ranks_per_node=None, binary=None, prefetch=2):
        self.dataset = dataset if isinstance(dataset, MixtureDataset) else MixtureDataset(dataset)
        mix = self.dataset
        nsrc = len(mix.sources)
        self.batch_size = _int_m("batch_size", batch_size, 1)
        self.seed = _int_m("seed", seed, 0, _MAX_SEED)
        if not isinstance(replacement, (bool, np.bool_)):
            raise _bad(f"replacement {replacement!r}: want True or False")
        self.replacement = bool(replacement)
        if policy not in ("locality", "random"):
            raise _bad(f"policy {policy!r}: want 'locality' or 'random' (solar's unequal local batches do not mix)")
        self.policy = policy
        if weights is not None and counts is not None:
            raise _bad("weights and counts: give one of them")
        srank, sranks, slocal = _identity(mix.sources[0])
        ranks = sranks if ranks is None else ranks
        self.ranks = 1 if ranks is None else _int_m("ranks", ranks, 1)
        rank = srank if rank is None else rank
        self.rank = 0 if rank is None else _int_m("rank", rank, 0)
        if self.rank >= self.ranks:
            raise _bad(f"rank {self.rank} not in [0, {self.ranks}): ranks {self.ranks}")
        if ranks_per_node is None:
            ranks_per_node = slocal if slocal and self.ranks % slocal == 0 else 1
        self.ranks_per_node = _int_m("ranks_per_node", ranks_per_node, 1)
        g = self.ranks * self.batch_size
        if counts is not None:
            c = self._vector("counts", counts, nsrc, integers=True)
            b = [self.batch_size * x // sum(c) for x in c]
            if any(self.batch_size * x % sum(c) for x in c):
                raise _bad(f"counts {c}: batch_size {self.batch_size} × count / {sum(c)} is not whole for every "
                           f"source: want counts in the proportions of integers summing to {self.batch_size}")
            if sum(c) % g:
                raise _bad(f"counts {c} sum to {sum(c)}, not a multiple of ranks {self.ranks} × batch_size "
                           f"{self.batch_size} = {g}: an epoch is whole global batches")
            self.weights, self.counts_per_epoch, self.epoch_samples = None, c, sum(c)
        else:
            w = self._vector("weights", mix.lengths if weights is None else weights, nsrc, integers=False)
            b = _shares(self.batch_size, w)
            for k, (wk, bk) in enumerate(zip(w, b)):
                if wk > 0 and bk == 0:
                    raise _bad(f"weight {wk!r} of source {mix.names[k]!r} gives it 0 of batch_size "
                               f"{self.batch_size} samples a step: raise batch_size or its weight")
            self.weights, self.counts_per_epoch, self.epoch_samples = w, None, int(sum(mix.lengths))
        self.shares = b
        caps = capacity if isinstance(capacity, (list, tuple)) else [capacity] * nsrc
        if len(caps) != nsrc:
            raise _bad(f"{len(caps)} capacities for {nsrc} sources")
        self.binary, self.prefetch = binary, _int_m("prefetch", prefetch, 0)
        self._src = [None] * nsrc  # each source's ScheduledSampler (None: no share, or with replacement)
        if not self.replacement:
            for k, ds in enumerate(mix.sources):
                if b[k] == 0:
                    continue
                try:
                    self._src[k] = ScheduledSampler(
                        ds, b[k], seed=(self.seed + (k + 1) * _GOLDEN) & _MASK, policy=policy, capacity=caps[k],
                        rank=self.rank, ranks=self.ranks, ranks_per_node=self.ranks_per_node, binary=binary, prefetch=0)
                except ArgumentError as e:
                    raise _bad(f"source {mix.names[k]!r} ({b[k]} of each batch): {str(e).split(': ', 2)[-1]}") from None
        self._epoch = 0
        # The run: it starts at mixture epoch run[0], position run[1]; each
        # source's stream then at its (epoch, position).
        self._run = (0, 0, [(0, 0)] * nsrc)
        self._token = None
        self._reset_steps()

    def _vector(self, what, v, nsrc, integers):
        try:
            vals = list(v)
        except TypeError:
            raise _bad(f"{what} of type {type(v).__name__}: want one number per source") from None
        if len(vals) != nsrc:
            raise _bad(f"{what} {vals}: {len(vals)} for {nsrc} sources {self.dataset.names}")
        out = []
        for k, x in enumerate(vals):
            if isinstance(x, (bool, np.bool_)) or not isinstance(x, numbers.Real) or \
                    (integers and not isinstance(x, numbers.Integral)):
                raise _bad(f"{what}[{k}] = {x!r} (source {self.dataset.names[k]!r}): want "
                           f"{'an integer' if integers else 'a number'} >= 0")
            if not math.isfinite(x) or x < 0:
                raise _bad(f"{what}[{k}] = {x!r} (source {self.dataset.names[k]!r}): want "
                           f"{'an integer' if integers else 'a finite number'} >= 0")
            out.append(int(x) if integers else float(x))
        if sum(out) <= 0:
            raise _bad(f"{what} {out} sum to 0: want at least one source drawn")
        return out

    # -- steps ---------------------------------------------------------------------

    def _steps_of(self, epoch):
        g = self.ranks * self.batch_size
        left = self.epoch_samples - (self._run[1] if epoch == self._run[0] else 0)
        return -(-left // g)

    def _offset(self, epoch, step):
        """Steps of this run before (epoch, step)."""
        e0 = self._run[0]
        if epoch == e0:
            return step
        return self._steps_of(e0) + (epoch - e0 - 1) * self._steps_of(e0 + 1) + step

    def _stream(self, k, offset):
        """(source epoch, step) of source k's stream `offset` steps into the run."""
        s = self._src[k]
        e0 = self._run[2][k][0]
        first = s.plan(e0, hits=False).steps
        if offset < first:
            return e0, offset
        q = offset - first
        return e0 + 1 + q // s._steps, q % s._steps

    def _draws(self, k, epoch, step):
        rng = np.random.Generator(np.random.PCG64([self.seed, k, epoch, step, self.rank]))
        return rng.integers(0, self.dataset.lengths[k], self.shares[k])

    def batch(self, epoch, step):
        """This rank's batch at `step` of `epoch`: mixture indices, an int64
        array, source after source."""
        parts = []
        off = self._offset(epoch, step)
        for k in range(len(self.shares)):
            if self.shares[k] == 0:
                continue
            if self.replacement:
                local = self._draws(k, epoch, step)
            else:
                se, st = self._stream(k, off)
                local = self._src[k].plan(se, hits=False).batch(st)
            parts.append(local + self.dataset.offsets[k])
        return np.concatenate(parts)

    def counts(self, epoch=None):
        """Samples of each source the mixture epoch reads, over all ranks:
        {name: count} (every rank reads as many of a source at a step)."""
        epoch = self._epoch if epoch is None else self._check_epoch(epoch)
        out = {n: 0 for n in self.dataset.names}
        off0 = self._offset(epoch, 0)
        for step in range(self._steps_of(epoch)):
            for k, name in enumerate(self.dataset.names):
                if self.shares[k] == 0:
                    continue
                if self.replacement:
                    out[name] += self.ranks * self.shares[k]
                else:
                    se, st = self._stream(k, off0 + step)
                    out[name] += self.ranks * len(self._src[k].plan(se, hits=False).batch(st))
        return out

    # -- the batch sampler --------------------------------------------------------

    @property
    def epoch(self):
        return self._epoch

    def _check_epoch(self, epoch):
        epoch = _int_m("epoch", epoch, 0)
        if epoch < self._run[0]:
            raise _bad(f"epoch {epoch} before epoch {self._run[0]}, where this run resumed the job")
        return epoch

    def __len__(self):
        return self._steps_of(self._epoch)

    def set_epoch(self, epoch):
        epoch = self._check_epoch(epoch)
        if epoch != self._epoch:
            self._epoch = epoch
            self._reset_steps()

    def __iter__(self):
        start, token = self._begin_pass()
        return _Pass(self, start, self._batches(self._epoch, start, token))

    def _batches(self, epoch, start, token):
        steps = self._steps_of(epoch)
        announce = getattr(self.dataset, "prefetch", None) if self.prefetch else None
        if announce is not None:
            for s in range(start, min(start + self.prefetch, steps)):
                announce(self.batch(epoch, s))
        for s in range(start, steps):
            if announce is not None and s + self.prefetch < steps:
                announce(self.batch(epoch, s + self.prefetch))
            b = self.batch(epoch, s).tolist()
            if self._token is token:
                self._pos = s + 1
            yield b

    # -- state ----------------------------------------------------------------------

    def state_dict(self, step=None):
        """seed, epoch, step, position (samples of the mixture epoch
        delivered over all ranks), each source's epoch and position, and
        what the mixture is a function of: small and JSON-serialisable."""
        if step is None:
            step = self._saved_step()
        step = _int_m("step", step, 0)
        steps = self._steps_of(self._epoch)
        if step > steps:
            raise _bad(f"step {step} above the {steps} steps of epoch {self._epoch}")
        base = self._run[1] if self._epoch == self._run[0] else 0
        position = min(base + step * self.ranks * self.batch_size, self.epoch_samples)
        sources = []
        off = self._offset(self._epoch, step)
        for k, name in enumerate(self.dataset.names):
            src = {"name": name, "n": int(self.dataset.lengths[k]), "epoch": 0, "position": 0}
            if self._src[k] is not None:
                se, st = self._stream(k, off)
                src["epoch"], src["position"] = se, int(self._src[k].plan(se, hits=False).positions[st])
            sources.append(src)
        return {"format": STATE_FORMAT, "kind": "mixture", "seed": self.seed, "epoch": self._epoch,
                "step": int(step), "position": int(position), "epoch_samples": self.epoch_samples,
                "policy": self.policy, "replacement": self.replacement, "weights": self.weights,
                "counts": self.counts_per_epoch, "sources": sources, "ranks": self.ranks,
                "batch_size": self.batch_size}

    def load_state_dict(self, state):
        """Resume from `state` (state_dict() of a MixtureSampler over the
        same sources, weights or counts and seed; of any number of ranks
        or batch_size): the mixture epoch goes on with the samples it has
        left, each source from its saved position. A state of another
        mixture raises ValueError naming the field and both values."""
        if not isinstance(state, dict):
            raise _bad(f"state of type {type(state).__name__}: want the dict of state_dict()")
        if state.get("format") != STATE_FORMAT or state.get("kind") != "mixture":
            raise _bad(f"format {state.get('format')!r} of kind {state.get('kind')!r} in the state: want format "
                       f"{STATE_FORMAT} of kind 'mixture'")
        missing = [k for k in ("seed", "epoch", "position", "epoch_samples", "policy", "replacement", "weights",
                               "counts", "sources") if k not in state]
        if missing:
            raise _bad(f"state without {', '.join(missing)}: want the dict of state_dict()")
        mine = self.state_dict(step=0)
        for k in ("seed", "policy", "replacement", "weights", "counts", "epoch_samples"):
            if state[k] != mine[k]:
                raise _bad(f"{k} {state[k]!r} in the state, {mine[k]!r} here: the state is of another mixture")
        srcs = state["sources"]
        if not isinstance(srcs, list) or len(srcs) != len(mine["sources"]):
            raise _bad(f"sources {srcs!r} in the state: want {len(mine['sources'])} of them")
        starts = []
        for k, (a, b) in enumerate(zip(srcs, mine["sources"])):
            for f in ("name", "n"):
                if not isinstance(a, dict) or a.get(f) != b[f]:
                    got = a.get(f) if isinstance(a, dict) else a
                    raise _bad(f"source {k}: {f} {got!r} in the state, {b[f]!r} here: the state is of another mixture")
            se = _int_m(f"source {b['name']!r} epoch", a.get("epoch"), 0)
            sp = _int_m(f"source {b['name']!r} position", a.get("position"), 0, b["n"])
            starts.append((se, sp))
        epoch = _int_m("epoch", state["epoch"], 0)
        position = _int_m("position", state["position"], 0, self.epoch_samples)
        self._run = (epoch, position, starts)
        for k, s in enumerate(self._src):
            if s is not None:
                s._set_run(starts[k], None)
        self._epoch, self._token = epoch, None
        self._reset_steps()

    def __repr__(self):
        return (f"MixtureSampler(sources={self.dataset.names}, shares={self.shares}, batch_size={self.batch_size}, "
                f"rank={self.rank}/{self.ranks}, seed={self.seed}, epoch={self._epoch})")


def _int_m(name, v, lo, hi=None):
    """ScheduledSampler's integer check, its errors naming MixtureSampler."""
    try:
        return _int(name, v, lo, hi)
    except ArgumentError as e:
        raise _bad(str(e).split("ScheduledSampler: ", 1)[-1]) from None
