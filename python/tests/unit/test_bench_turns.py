"""The Python bench's samples taken in turns: every op sampled as often as
the others, each sample a positive rate."""

from ddstore_bench.bench import _interleaved


def test_interleaved_samples_every_op_in_turn():
    calls = {"a": 0, "b": 0}

    def op(key):
        def f():
            calls[key] += 1
            sum(range(200 if key == "a" else 2000))
        return f
    samples = _interleaved(0.02, 1000, {"a": op("a"), "b": op("b")})
    assert set(samples) == {"a", "b"}
    assert len(samples["a"]) == len(samples["b"]) >= 5
    assert all(x > 0 for v in samples.values() for x in v)
    assert calls["a"] > calls["b"], "the cheaper op is repeated more per sample"


def test_interleaved_counts_faults_per_call():
    # An op that writes fresh pages every call faults, one that reads a
    # buffer already written does not (or hardly: the process may fault
    # elsewhere).
    import mmap

    import numpy as np
    warm = np.ones(1 << 20, np.uint8)

    def fresh():  # a new anonymous mapping written through: new pages each call
        m = mmap.mmap(-1, 8 << 20)
        np.frombuffer(m, np.uint8)[::4096] = 1
        m.close()

    def reuse():
        warm.sum()
    samples, usage = _interleaved(0.02, 1000, {"fresh": fresh, "reuse": reuse}, usage=True)
    assert set(usage) == {"fresh", "reuse"} and set(samples) == {"fresh", "reuse"}
    assert usage["fresh"][0] > 100, usage  # 2048 pages of 4 KiB
    assert usage["reuse"][0] < usage["fresh"][0] / 10, usage
    assert all(s >= 0 for _, s in usage.values())


def test_page_aligned():
    import numpy as np
    from ddstore_bench.bench import page_aligned
    for shape, dt in (((3, 5000), np.uint8), ((256, 64), np.float32), ((7,), np.int64)):
        a = page_aligned(shape, dt)
        assert a.shape == shape and a.dtype == dt and a.ctypes.data % 4096 == 0 and not a.any()
        assert a.flags.c_contiguous and a.flags.writeable


def test_latencies_take_every_op_in_turn():
    from ddstore_bench.bench import _latencies
    order = []
    ops = {k: (lambda k: lambda i: order.append((k, i)))(k) for k in "abc"}
    out = _latencies(40, ops)
    # One call of each per turn, in orders that differ from turn to turn.
    turns = [order[3 * i:3 * i + 3] for i in range(40)]
    assert all(sorted(t) == [("a", i), ("b", i), ("c", i)] for i, t in enumerate(turns))
    assert len({tuple(k for k, _ in t) for t in turns}) > 1
    assert {t[0][0] for t in turns} == {"a", "b", "c"}
    assert set(out) == {"a", "b", "c"} and all(0 <= p50 <= p99 for p50, p99 in out.values())


def test_pings_side_by_side_end():
    # Two ping children at once (the second forked while the first's
    # connection is open): each answers its round trips, and each closes
    # although the other child holds a copy of its socket.
    import socket

    from ddstore_bench.bench import Ping
    tcp = Ping(socket.AF_INET, 64)
    unix = Ping(socket.AF_UNIX, 4096)
    try:
        for _ in range(3):
            tcp()
            unix()
        assert len(tcp.buf) == 32 + 64 and len(unix.buf) == 32 + 4096
    finally:
        tcp.close()
        unix.close()
