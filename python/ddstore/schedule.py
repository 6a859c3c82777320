"""The order of every epoch, the same as the Go side's
internal/schedule.Permutation: a function of (seed, epoch, n) alone, so that
every rank, every worker and a restarted job compute it without talking to
each other.

Sample i gets a 64-bit key, the (i+1)-th output of SplitMix64 started from a
state derived from (seed, epoch); the epoch visits the samples in the order of
their keys, ties by index. The keys are computed on whole numpy arrays
(uint64 arithmetic wraps modulo 2**64, as Go's does) and sorted with a stable
argsort.

    from ddstore.schedule import permutation
    order = permutation(seed=7, epoch=3, n=1000)   # int64 array, a permutation of 0..999
"""

import operator

import numpy as np

from ._errors import ArgumentError

__all__ = ["permutation", "sort_keys", "MAX_SAMPLES"]

#: The largest dataset an order covers: the Go side's indices are int32.
MAX_SAMPLES = 2**31 - 1

_MASK = 2**64 - 1
_GOLDEN = 0x9E3779B97F4A7C15  # SplitMix64's increment
_M1 = 0xBF58476D1CE4E5B9
_M2 = 0x94D049BB133111EB


def _mix_int(z):
    """SplitMix64's output function on one Python int (mod 2**64)."""
    z &= _MASK
    z = ((z ^ (z >> 30)) * _M1) & _MASK
    z = ((z ^ (z >> 27)) * _M2) & _MASK
    return z ^ (z >> 31)


def _mix(z):
    """SplitMix64's output function on a uint64 array, wrapping."""
    z = (z ^ (z >> np.uint64(30))) * np.uint64(_M1)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(_M2)
    return z ^ (z >> np.uint64(31))


def _int(name, value, lo, hi):
    if isinstance(value, (bool, np.bool_)):
        raise ArgumentError(f"ddstore: bad argument: schedule: {name} {value!r}: want an integer")
    try:
        v = operator.index(value)
    except TypeError:
        raise ArgumentError(f"ddstore: bad argument: schedule: {name} {value!r}: want an integer") from None
    if not lo <= v <= hi:
        raise ArgumentError(f"ddstore: bad argument: schedule: {name} {v} not in [{lo}, {hi}]")
    return v


def sort_keys(seed, epoch, n):
    """The keys permutation() sorts, as a uint64 array of n."""
    seed = _int("seed", seed, 0, _MASK)
    epoch = _int("epoch", epoch, 0, _MASK)
    n = _int("n", n, 0, MAX_SAMPLES)
    state = _mix_int(_mix_int(seed) + epoch * _GOLDEN)
    i = np.arange(1, n + 1, dtype=np.uint64)
    with np.errstate(over="ignore"):
        return _mix(np.uint64(state) + i * np.uint64(_GOLDEN))


def permutation(seed, epoch, n):
    """The order in which epoch `epoch` visits the samples 0..n-1 under
    `seed`: an int64 array, identical to the Go side's
    schedule.Permutation(seed, epoch, n). seed is in [0, 2**64), epoch >= 0,
    0 <= n <= MAX_SAMPLES; anything else raises ArgumentError."""
    return np.argsort(sort_keys(seed, epoch, n), kind="stable").astype(np.int64, copy=False)
