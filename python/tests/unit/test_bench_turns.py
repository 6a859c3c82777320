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
