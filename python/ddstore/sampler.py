"""The schedule's plans as the `ddstore` binary writes them: `ddstore
schedule --emit-rank R --epoch E` (internal/schedule, the one implementation
of the policies) prints one rank's part of one epoch, read here into an
EpochPlan. Needs no torch: ddstore.torch.ScheduledSampler, the batch sampler
that yields the plans' batches, builds on it.

    from ddstore.torch import ScheduledSampler
"""

import io
import operator
import subprocess

import numpy as np

from ._errors import EXIT_USAGE, ArgumentError, InternalError, from_exit

__all__ = ["ScheduledSampler", "EpochPlan", "POLICIES", "read_plan"]

POLICIES = ("random", "solar", "locality")
_MAX_SEED = 2**64 - 1
_MAX_SAMPLES = 2**31 - 1


def _bad(msg):
    return ArgumentError(f"ddstore: bad argument: ScheduledSampler: {msg}")


def _int(name, v, lo, hi=None):
    if isinstance(v, (bool, np.bool_)):
        raise _bad(f"{name} {v!r}: want an integer")
    try:
        v = operator.index(v)
    except TypeError:
        raise _bad(f"{name} {v!r}: want an integer") from None
    if v < lo:
        raise _bad(f"{name} {v}: want an integer >= {lo}")
    if hi is not None and v > hi:
        raise _bad(f"{name} {v}: want an integer <= {hi}")
    return v


class EpochPlan:
    """One rank's part of one epoch, as `ddstore schedule --emit-rank`
    wrote it: samples (int64, step after step), sizes (int64 per step: how
    many samples), hits (bool per sample: memory holds it under the plan;
    None if not asked for). Under a byte budget (rows of different sizes)
    also bytes (int64 per step: the bytes the rank reads) and storage_bytes
    (int64 per step: of them, from storage; None without hits); both None
    otherwise. positions (int64, steps + 1; None if not asked for): the
    position of the epoch's global order (its permutation, padded) before
    each step, then n: a job stopped after step k resumes from
    positions[k] on any number of ranks."""

    __slots__ = ("epoch", "samples", "sizes", "hits", "offsets", "bytes", "storage_bytes", "positions")

    def __init__(self, epoch, samples, sizes, hits, nbytes=None, storage_bytes=None, positions=None):
        self.epoch, self.samples, self.sizes, self.hits = epoch, samples, sizes, hits
        self.bytes, self.storage_bytes, self.positions = nbytes, storage_bytes, positions
        self.offsets = np.concatenate(([0], np.cumsum(sizes))).astype(np.int64)

    @property
    def steps(self):
        return int(self.sizes.shape[0])

    def batch(self, step):
        """The samples of `step`, an int64 array."""
        return self.samples[self.offsets[step]:self.offsets[step + 1]]

    def storage_reads(self, step):
        """The samples of `step` that the plan reads from storage (a plan
        asked for with hits)."""
        if self.hits is None:
            raise ArgumentError("ddstore: bad argument: this plan has no hit flags: ask "
                                "ScheduledSampler.plan(epoch, hits=True)")
        lo, hi = self.offsets[step], self.offsets[step + 1]
        return self.samples[lo:hi][~self.hits[lo:hi]]

    def __repr__(self):
        return f"EpochPlan(epoch={self.epoch}, steps={self.steps}, samples={self.samples.shape[0]})"


def read_plan(args, epoch, hits, nbytes=False, stdin=None, positions=False):
    """The EpochPlan that `args` (a `ddstore schedule ... --emit-rank R
    --epoch E` command line, with --emit-hits when hits; nbytes: with
    --sizes or --offsets, so it also writes each step's bytes; positions:
    with --emit-positions) writes;
    stdin, bytes for the binary's stdin (the .npy of `--sizes -`). The
    binary's exit status says what failed (from_exit): a bad combination
    of arguments is an ArgumentError. The usage status means the binary
    does not take a flag of this command line, which this package built:
    the binary is older than the package. Its stderr is only passed on."""
    try:
        if stdin is None:
            r = subprocess.run(args, stdin=subprocess.DEVNULL, capture_output=True)
        else:
            r = subprocess.run(args, input=stdin, capture_output=True)
    except OSError as e:
        raise InternalError(f"ddstore: internal error: cannot run {args[0]}: {e}") from None
    err = r.stderr.decode(errors="replace").strip()
    if r.returncode == EXIT_USAGE:
        raise InternalError(f"ddstore: internal error: {args[0]} does not take `{' '.join(args[1:])}` (it has "
                            f"no `schedule --emit-rank`, or not all its flags): it is older than this package; "
                            f"rebuild it (make build) or set DDSTORE_BIN: {err}")
    if r.returncode != 0:
        e = from_exit(r.returncode, err)
        if type(e) is InternalError:  # no kind of the binary's: say what ran
            e = InternalError(f"ddstore: internal error: `{' '.join(args)}` failed ({r.returncode}): {err}")
        raise e
    f = io.BytesIO(r.stdout)
    try:
        samples = np.lib.format.read_array(f)
        sizes = np.lib.format.read_array(f)
        flags = np.lib.format.read_array(f) if hits else None
        step_bytes = np.lib.format.read_array(f) if nbytes else None
        storage = np.lib.format.read_array(f) if nbytes and hits else None
        pos = np.lib.format.read_array(f) if positions else None
    except (ValueError, EOFError) as e:
        raise InternalError(f"ddstore: internal error: `{' '.join(args)}` wrote no plan ({e})") from None
    if (samples.ndim != 1 or sizes.ndim != 1 or (flags is not None and flags.shape != samples.shape)
            or f.read(1) or int(sizes.sum()) != samples.shape[0]
            or any(a is not None and a.shape != sizes.shape for a in (step_bytes, storage))
            or (pos is not None and pos.shape != (sizes.shape[0] + 1,))):
        raise InternalError(f"ddstore: internal error: `{' '.join(args)}` wrote a malformed plan: "
                            f"samples {samples.shape}, "
                            f"sizes {sizes.shape} summing to {int(sizes.sum())}, "
                            f"hits {None if flags is None else flags.shape}, "
                            f"bytes {None if step_bytes is None else step_bytes.shape}, "
                            f"storage bytes {None if storage is None else storage.shape}, "
                            f"positions {None if pos is None else pos.shape}")

    def i64(a):
        return None if a is None else a.astype(np.int64, copy=False)
    return EpochPlan(epoch, i64(samples), i64(sizes), None if flags is None else flags.astype(bool, copy=False),
                     i64(step_bytes), i64(storage), i64(pos))


def __getattr__(name):
    # ScheduledSampler is a torch Sampler: it lives in ddstore.torch, and is
    # loaded from there only when asked for by this module's name.
    if name == "ScheduledSampler":
        from .torch.sampler import ScheduledSampler
        return ScheduledSampler
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
