"""BudgetSampler: a batch sampler whose batches are filled up to a budget of
atoms, tokens or bytes rather than to a count of samples, read from the
sizes of a ragged field alone (ragged_sizes: the node's index, no request
for the rows), deterministic and resumable.

    from ddstore.torch import BudgetSampler, Graphs, ThreadDataLoader

    ds = DistDataset(graphs, "qm9")                      # x [n_i, F] is ragged
    sampler = BudgetSampler(ds, budget=4096, field="x", seed=7)
    loader = ThreadDataLoader(ds, batch_sampler=sampler, collate_fn=Graphs(edges={"edge_index": "x"}))
    for epoch in range(start_epoch, epochs):
        sampler.set_epoch(epoch)
        for g in loader:                                 # at most 4096 atoms a batch
            train(g)
            sampler.consumed()
    # state_dict() / load_state_dict() as ScheduledSampler's: on any number of ranks

How an epoch is dealt: the samples in the order of a permutation drawn from
(seed, epoch) (numpy's PCG64; in index order with shuffle=False) are cut
into batches greedily: a batch takes the next samples while its cost stays
within the budget (cost "sum": the sizes added up, what concatenation
holds; "padded": the batch's samples times its largest size, what padding
holds; max_samples caps the count). Every rank computes the same batches
from the same sizes and takes batches rank, rank + ranks, ...; so that
every rank runs the same number of steps, the last round is padded with
the epoch's first batches (drop_last: dropped). Steps per epoch therefore
depend on the epoch.

Resuming: the state holds the epoch and its position, the batches of the
epoch's list delivered (steps × ranks). Loaded on the same ranks it goes on
at the saved step; on another number of ranks the batches left are dealt
over the new ranks the same way (the last round padded with the epoch's
first batches), each once.
"""

import numpy as np
from torch.utils.data import Sampler

from .._errors import ArgumentError
from ..sampler import _MAX_SEED, _int
from .sampler import _Pass, _dataset_name, _identity

__all__ = ["BudgetSampler"]

COSTS = ("sum", "padded")
# The state keys that fix the deal: a state saved under other values
# describes other batches.
_SAME = ("n", "ranks", "budget", "cost", "max_samples", "shuffle", "drop_last", "sizes_digest")
# What a state of format 2 must agree on (its ranks may differ).
_IDENTITY = ("dataset", "seed") + tuple(k for k in _SAME if k != "ranks")
STATE_FORMAT = 2


def _bad_b(msg):
    return ArgumentError(f"ddstore: bad argument: BudgetSampler: {msg}")


class BudgetSampler(Sampler):
    """A batch sampler (DataLoader(batch_sampler=...), ThreadDataLoader
    likewise) yielding this rank's batches, lists of dataset indices, each
    filled up to `budget` (see the module's docstring).

    dataset: a DistDataset or DistDatasetReader (the sizes come from its
    field's ragged variable: dataset.sizes(field)), or anything of len()
    with sizes= given. field: the ragged field whose sizes count (default:
    the dataset's first ragged field). sizes: the per-sample sizes instead
    (int64, one per sample). budget: the most a batch may cost; a sample
    costing more alone is an error naming it. seed: the seed of every
    epoch's order, [0, 2**64). rank, ranks: override what the dataset's
    store says (without a store: torch.distributed when initialized, else
    one rank).
    """

    def __init__(self, dataset, budget, field=None, sizes=None, seed=0, shuffle=True, drop_last=False,
                 cost="sum", max_samples=None, rank=None, ranks=None):
        self.budget = _int_b("budget", budget, 1)
        self.seed = _int_b("seed", seed, 0, _MAX_SEED)
        if not isinstance(cost, str) or cost not in COSTS:
            raise _bad_b(f"cost {cost!r}: want one of {', '.join(repr(c) for c in COSTS)}")
        self.cost = cost
        self.max_samples = None if max_samples is None else _int_b("max_samples", max_samples, 1)
        for what, v in (("shuffle", shuffle), ("drop_last", drop_last)):
            if not isinstance(v, (bool, np.bool_)):
                raise _bad_b(f"{what} {v!r}: want True or False")
        self.shuffle, self.drop_last = bool(shuffle), bool(drop_last)
        if sizes is None:
            reader = getattr(dataset, "sizes", None)
            if reader is None:
                raise _bad_b(f"dataset of type {type(dataset).__name__} tells no sizes: pass sizes=")
            sizes = reader(field)
        s = np.asarray(sizes)
        if s.ndim != 1 or s.shape[0] < 1 or s.dtype.kind not in "iu":
            raise _bad_b(f"sizes of shape {s.shape} and type {s.dtype}: want one integer per sample")
        s = s.astype(np.int64)
        if dataset is not None and not isinstance(dataset, (int, np.integer)) and hasattr(dataset, "__len__") \
                and len(dataset) != s.shape[0]:
            raise _bad_b(f"{s.shape[0]} sizes for a dataset of {len(dataset)} samples")
        neg = np.flatnonzero(s < 0)
        if neg.size:
            raise _bad_b(f"sizes[{int(neg[0])}] = {int(s[neg[0]])}: want sizes >= 0")
        over = np.flatnonzero(s > self.budget)
        if over.size:
            i = int(over[0])
            raise _bad_b(f"sample {i} has size {int(s[i])}, above the budget {self.budget} ({over.size} samples "
                         f"are): raise the budget")
        self.sizes, self.n = s, int(s.shape[0])
        # A digest of the sizes: a saved state resumes only over the same ones.
        self.sizes_digest = int(np.bitwise_xor.reduce(s * np.int64(-7046029254386353131)
                                                      + np.arange(self.n, dtype=np.int64)) & 0x7FFFFFFFFFFFFFFF)
        srank, sranks, _ = _identity(dataset)
        ranks = sranks if ranks is None else ranks
        self.ranks = 1 if ranks is None else _int_b("ranks", ranks, 1)
        rank = srank if rank is None else rank
        self.rank = 0 if rank is None else _int_b("rank", rank, 0)
        if self.rank >= self.ranks:
            raise _bad_b(f"rank {self.rank} not in [0, {self.ranks}): ranks {self.ranks}")
        self._epoch = 0
        self._start = 0       # the step the next iteration starts from
        self._pos = None      # steps of this epoch yielded, None before a pass
        self._consumed = None  # steps of this epoch consumed, None unless counted
        self._pass_start = 0
        self._token = None
        self._cache = None    # (epoch, this rank's batches)
        self.dataset_name = None if dataset is None else _dataset_name(dataset)
        self._run_start = None  # (epoch, position) where a run resumed on other ranks began
        if len(self._global(0)) < self.ranks and self.drop_last:
            raise _bad_b(f"{len(self._global(0))} batches for {self.ranks} ranks with drop_last: not one step")

    # -- the deal -------------------------------------------------------------------

    def _order(self, epoch):
        if not self.shuffle:
            return np.arange(self.n, dtype=np.int64)
        return np.random.Generator(np.random.PCG64([self.seed, epoch])).permutation(self.n)

    def _global(self, epoch):
        """Every rank's batches of `epoch`, in order: a list of int64 arrays."""
        order = self._order(epoch)
        s = self.sizes[order]
        cap = self.max_samples or self.n
        cuts = [0]
        if self.cost == "sum":
            cum = np.concatenate(([0], np.cumsum(s)))
            lo = 0
            while lo < self.n:
                hi = int(np.searchsorted(cum, cum[lo] + self.budget, side="right")) - 1
                hi = min(max(hi, lo + 1), lo + cap, self.n)
                cuts.append(hi)
                lo = hi
        else:
            count = longest = 0
            for k, x in enumerate(s.tolist()):
                if count and (count >= cap or (count + 1) * max(longest, x) > self.budget):
                    cuts.append(k)
                    count = longest = 0
                count += 1
                longest = max(longest, x)
            cuts.append(self.n)
        return [order[a:b] for a, b in zip(cuts[:-1], cuts[1:])]

    def _first(self, epoch):
        """The batch of the epoch's list this run starts it at."""
        return self._run_start[1] if self._run_start is not None and self._run_start[0] == epoch else 0

    def _mine(self, epoch):
        if self._cache is not None and self._cache[0] == epoch:
            return self._cache[1]
        every = self._global(epoch)
        first = min(self._first(epoch), len(every))
        left = len(every) - first
        steps = left // self.ranks if self.drop_last else -(-left // self.ranks)
        need = steps * self.ranks
        # The batches from first on, the last round padded with the epoch's first batches.
        rest = [every[(first + k) % len(every)] for k in range(need)]
        mine = rest[self.rank:need:self.ranks]
        self._cache = (epoch, mine, first, len(every))
        return mine

    def _position(self, epoch, step):
        mine = self._mine(epoch)
        _, _, first, total = self._cache
        return total if step >= len(mine) else min(first + step * self.ranks, total)

    def batches(self, epoch=None):
        """This rank's batches of `epoch` (default: the current one)."""
        return list(self._mine(self._epoch if epoch is None else _int_b("epoch", epoch, 0)))

    # -- the batch sampler --------------------------------------------------------

    @property
    def epoch(self):
        return self._epoch

    def __len__(self):
        """Steps of the current epoch (they depend on the epoch)."""
        return len(self._mine(self._epoch))

    def set_epoch(self, epoch):
        """Make the next iteration run `epoch`; the same epoch as now keeps
        a step load_state_dict set, another starts at step 0."""
        epoch = _int_b("epoch", epoch, 0)
        if epoch != self._epoch:
            self._epoch, self._start, self._pos, self._consumed, self._pass_start = epoch, 0, None, None, 0

    def __iter__(self):
        mine = self._mine(self._epoch)
        start = self._start
        self._start, self._pos, self._consumed, self._pass_start = 0, start, None, start
        token = self._token = object()
        return _Pass(self, start, self._yield(mine, start, token))

    def _yield(self, mine, start, token):
        for s in range(start, len(mine)):
            b = mine[s].tolist()
            if self._token is token:
                self._pos = s + 1
            yield b

    def consumed(self, k=1):
        """Count k more batches of this epoch as trained on (see
        ScheduledSampler.consumed)."""
        k = _int_b("k", k, 0)
        pos = self._pos if self._pos is not None else self._start
        done = (self._consumed if self._consumed is not None else self._pass_start) + k
        if done > pos:
            raise _bad_b(f"consumed {done} batches of epoch {self._epoch}, only {pos} yielded")
        self._consumed = done

    # -- state ----------------------------------------------------------------------

    def state_dict(self, step=None):
        """seed, epoch, step (`step` when given, else the batches counted by
        consumed(), else those yielded) and what the batches depend on."""
        if step is None:
            step = next(v for v in (self._consumed, self._pos, self._start) if v is not None)
        else:
            step = self._check_step(step, self._epoch)
        return {"format": STATE_FORMAT, "dataset": self.dataset_name, "seed": self.seed, "epoch": self._epoch,
                "step": int(step), "position": self._position(self._epoch, step), "n": self.n, "ranks": self.ranks,
                "budget": self.budget, "cost": self.cost, "max_samples": self.max_samples, "shuffle": self.shuffle,
                "drop_last": self.drop_last, "sizes_digest": self.sizes_digest,
                "run_start": None if self._run_start is None else list(self._run_start)}

    def _check_step(self, step, epoch):
        step = _int_b("step", step, 0)
        steps = len(self._mine(epoch))
        if step > steps:
            raise _bad_b(f"step {step} above the {steps} steps of epoch {epoch}")
        return step

    def load_state_dict(self, state, step=None):
        """Resume from `state` (state_dict() of a sampler over the same
        sizes, budget and seed, on any rank of a job of any number of
        ranks): on the same ranks the batches an uninterrupted run would
        have yielded from the saved step (or `step`) on; on others, the
        batches of the epoch not yet delivered, dealt over this job's
        ranks. A state of other batches raises ValueError naming the field."""
        if not isinstance(state, dict):
            raise _bad_b(f"state of type {type(state).__name__}: want the dict of state_dict()")
        fmt = state.get("format", 1)
        if fmt not in (1, STATE_FORMAT) or isinstance(fmt, bool):
            raise _bad_b(f"format {fmt!r} in the state: want 1 or {STATE_FORMAT}, the formats this sampler reads")
        keys = ("seed", "epoch", "step") + _SAME if fmt == 1 else ("epoch", "step", "position", "run_start") + _IDENTITY
        missing = [k for k in keys if k not in state]
        if missing:
            raise _bad_b(f"state without {', '.join(missing)}: want the dict of state_dict()")
        mine = self.state_dict(step=0)
        for k in (("seed",) + _SAME if fmt == 1 else _IDENTITY):
            if k == "dataset" and (state[k] is None or mine[k] is None):
                continue
            if state[k] != mine[k]:
                raise _bad_b(f"{k} {state[k]!r} in the state, {mine[k]!r} here: the state is of other batches")
        epoch = _int_b("epoch", state["epoch"], 0)
        run_start = None if fmt == 1 else state["run_start"]
        if run_start is not None:
            if not isinstance(run_start, (list, tuple)) or len(run_start) != 2:
                raise _bad_b(f"run_start {run_start!r} in the state: want [epoch, position] or None")
            run_start = (_int_b("run_start epoch", run_start[0], 0, epoch), _int_b("run_start position",
                                                                                 run_start[1], 0))
        if fmt == 1 or state["ranks"] == self.ranks:
            self._set_run(run_start)
            k = self._check_step(state["step"] if step is None else step, epoch)
            if fmt != 1 and step is None and self._position(epoch, k) != state["position"]:
                raise _bad_b(f"step {k} and position {state['position']!r} in the state disagree: step {k} of "
                             f"epoch {epoch} ends at position {self._position(epoch, k)}")
        else:
            if step is not None:
                raise _bad_b(f"step {step!r} with a state of ranks {state['ranks']!r} ({self.ranks} here): a step is "
                             f"of the saved deal; on other ranks the state's position resumes")
            self._set_run((epoch, _int_b("position", state["position"], 0)))
            k = 0
        self._epoch, self._start, self._pos, self._consumed, self._token = epoch, k, None, None, None
        self._pass_start = k

    def _set_run(self, run_start):
        if run_start != self._run_start:
            self._run_start, self._cache = run_start, None

    def __repr__(self):
        return (f"BudgetSampler(n={self.n}, budget={self.budget}, cost={self.cost!r}, rank={self.rank}/{self.ranks}, "
                f"seed={self.seed}, epoch={self._epoch})")


def _int_b(name, v, lo, hi=None):
    """ScheduledSampler's integer check, its errors naming BudgetSampler."""
    try:
        return _int(name, v, lo, hi)
    except ArgumentError as e:
        raise _bad_b(str(e).split("ScheduledSampler: ", 1)[-1]) from None
