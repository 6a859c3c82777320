"""ScheduledSampler under a byte budget (rows of different sizes): the
arguments it takes (sizes, capacity_bytes, pin), what it passes to `ddstore
schedule` (--sizes - on stdin, --capacity-bytes, --pin), the plans it reads
back with their bytes, and its state."""

import json
import subprocess

import numpy as np
import pytest

pytest.importorskip("torch")
from ddstore.torch import ScheduledSampler  # noqa: E402


def token_sizes(n, seed=1):
    """Bytes of n tokenized documents: log-normal lengths, 4 bytes a token."""
    rng = np.random.default_rng(seed)
    return 4 * np.clip(np.round(np.exp(np.log(512) + rng.standard_normal(n))), 16, 32768).astype(np.int64)


def emitted(binary, sizes_file, n, capacity_bytes, policy, rank, epoch, pin="bytes", ranks=4):
    args = [binary, "schedule", "--sizes", str(sizes_file), "--n", str(n), "--ranks", str(ranks), "--ranks-per-node", "2",
            "--batch", "4", "--epochs", "3", "--capacity-bytes", str(capacity_bytes), "--policy", policy, "--pin", pin,
            "--seed", "7", "--iterations", "50", "--emit-rank", str(rank), "--epoch", str(epoch), "--emit-hits", "--json"]
    return json.loads(subprocess.run(args, check=True, capture_output=True, text=True).stdout)


@pytest.mark.parametrize("policy,pin", [("locality", "bytes"), ("locality", "samples"), ("random", "bytes"),
                                        ("solar", "bytes")])
def test_plans_are_the_binarys(ddstore_bin, tmp_path, policy, pin):
    """The sampler's batches, hits and bytes are those `ddstore schedule
    --sizes FILE` prints for the same sizes: it passes them on."""
    n = 300
    sizes = token_sizes(n)
    f = tmp_path / "sizes.npy"
    np.save(f, sizes)
    budget = int(sizes.sum()) // 3
    for rank in range(4):
        s = ScheduledSampler(n, 4, seed=7, policy=policy, epochs=3, rank=rank, ranks=4, ranks_per_node=2,
                             swarm_iterations=50, binary=ddstore_bin, sizes=sizes, capacity_bytes=budget, pin=pin)
        for e in range(3):
            want = emitted(ddstore_bin, f, n, budget, policy, rank, e, pin)
            s.set_epoch(e)
            assert list(s) == want["samples"], (policy, rank, e)
            plan = s.plan(e)
            assert plan.hits.tolist() == [h for step in want["hits"] for h in step]
            assert plan.bytes.tolist() == want["bytes"] == [int(sizes[b].sum()) for b in want["samples"]]
            assert plan.storage_bytes.tolist() == want["storage_bytes"]
            assert plan.storage_bytes.tolist() == [int(sizes[plan.storage_reads(k)].sum()) for k in range(plan.steps)]
        # Planned without hits: the steps' bytes, no storage bytes.
        bare = ScheduledSampler(n, 4, seed=7, policy=policy, epochs=3, rank=rank, ranks=4, ranks_per_node=2,
                                swarm_iterations=50, binary=ddstore_bin, sizes=sizes, capacity_bytes=budget,
                                pin=pin).plan(2, hits=False)
        assert bare.hits is None and bare.storage_bytes is None and bare.bytes.tolist() == plan.bytes.tolist()


def test_arguments_passed_on(ddstore_bin):
    sizes = token_sizes(200)
    s = ScheduledSampler(200, 4, seed=3, binary=ddstore_bin, sizes=sizes, capacity_bytes=100000, pin="samples")
    a = s._args(0)
    assert a[a.index("--sizes") + 1] == "-" and a[a.index("--capacity-bytes") + 1] == "100000"
    assert a[a.index("--pin") + 1] == "samples" and "--capacity" not in a
    assert (s.capacity, s.capacity_bytes, s.pin) == (None, 100000, "samples")
    assert "capacity_bytes=100000" in repr(s)
    # Without sizes: the budget in samples, as before.
    c = ScheduledSampler(200, 4, seed=3, capacity=50, binary=ddstore_bin)
    a = c._args(0)
    assert a[a.index("--capacity") + 1] == "50" and "--sizes" not in a and "--capacity-bytes" not in a
    assert c.plan(0).bytes is None and c.plan(0).storage_bytes is None
    # capacity_bytes defaults to the whole dataset: every read a hit; pin to bytes.
    d = ScheduledSampler(200, 4, seed=3, binary=ddstore_bin, sizes=list(sizes))
    assert d.capacity_bytes == int(sizes.sum()) and d.pin == "bytes"
    assert d.plan(0).hits.all() and not d.plan(0).storage_bytes.any()


def test_locality_fills_the_budget(ddstore_bin):
    """One rank: a hit rate of bytes near M/S, every batch B samples, and
    more samples from memory with pin="samples"."""
    n = 2000
    sizes = token_sizes(n, seed=2)
    budget = int(sizes.sum()) // 2
    rate = {}
    for pin in ("bytes", "samples"):
        s = ScheduledSampler(n, 8, seed=1, binary=ddstore_bin, sizes=sizes, capacity_bytes=budget, pin=pin)
        plan = s.plan(1)
        assert (plan.sizes == 8).all()
        hit_bytes = int(plan.bytes.sum() - plan.storage_bytes.sum())
        assert hit_bytes <= budget and hit_bytes > budget - sizes.max()
        rate[pin] = plan.hits.mean()
    assert rate["samples"] > rate["bytes"] + 0.2


@pytest.mark.parametrize("kw,want", [
    (dict(sizes=np.ones(10, dtype=np.int64), capacity=5), "capacity 5 with sizes"),
    (dict(capacity_bytes=100), "capacity_bytes goes with sizes"),
    (dict(pin="bytes"), "pin goes with sizes"),
    (dict(sizes=np.ones(10, dtype=np.int64), pin="knapsack"), "pin 'knapsack'"),
    (dict(sizes=np.ones(9, dtype=np.int64)), "sizes of shape [9]: want one size per sample, shape [10]"),
    (dict(sizes=np.ones((10, 1), dtype=np.int64)), "sizes of shape [10, 1]"),
    (dict(sizes=np.ones(10)), "sizes of dtype float64: want integers"),
    (dict(sizes=np.array([1] * 9 + [-2])), "sizes[9] = -2"),
    (dict(sizes=np.zeros(10, dtype=np.int64)), "add up to 0 bytes"),
    (dict(sizes=np.ones(10, dtype=np.int64), capacity_bytes=11), "capacity_bytes 11 above the dataset's 10 bytes"),
    (dict(sizes=np.ones(10, dtype=np.int64), capacity_bytes=0), "capacity_bytes 0: want an integer >= 1"),
    (dict(sizes="atoms"), "sizes 'atoms': a variable's name needs a store-backed dataset"),
])
def test_bad_arguments(ddstore_bin, kw, want):
    with pytest.raises(ValueError, match=want.replace("[", r"\[").replace("]", r"\]")):
        ScheduledSampler(10, 2, binary=ddstore_bin, **kw)
    # After an error, a good sampler still works.
    assert len(ScheduledSampler(10, 2, binary=ddstore_bin, sizes=np.ones(10, dtype=np.int64))) == 5


def test_state_names_the_sizes(ddstore_bin):
    sizes = token_sizes(100)
    s = ScheduledSampler(100, 4, seed=2, binary=ddstore_bin, sizes=sizes, capacity_bytes=10000)
    s.set_epoch(1)
    it = iter(s)
    next(it), next(it)
    st = s.state_dict()
    assert (st["capacity_bytes"], st["pin"], st["capacity"]) == (10000, "bytes", None) and len(st["sizes"]) == 16
    same = ScheduledSampler(100, 4, seed=2, binary=ddstore_bin, sizes=sizes.copy(), capacity_bytes=10000)
    same.load_state_dict(st)
    assert list(same) == s.plan(1).samples.reshape(-1, 4)[2:].tolist()  # on from step 2
    other = sizes.copy()
    other[0] += 1
    for kw, key, what in ((dict(sizes=other, capacity_bytes=10000), "sizes", "dataset"),
                          (dict(sizes=sizes, capacity_bytes=10000, pin="samples"), "pin", "order"),
                          (dict(capacity=50), "sizes", "dataset")):
        with pytest.raises(ValueError, match=f"{key} .* in the state, .* here: the state is of another {what}"):
            ScheduledSampler(100, 4, seed=2, binary=ddstore_bin, **kw).load_state_dict(st)
    # Another budget is another geometry: the rows left are dealt under it.
    smaller = ScheduledSampler(100, 4, seed=2, binary=ddstore_bin, sizes=sizes, capacity_bytes=9999)
    smaller.load_state_dict(st)
    assert sorted(x for b in smaller for x in b) == sorted(s.plan(1).samples[8:].tolist())


def test_golden_byte_schedules(ddstore_bin):
    """Every rank's batches and hits of every epoch equal the Go schedules
    under a byte budget pinned in internal/schedule/testdata/golden_bytes.json."""
    import os
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    with open(os.path.join(root, "internal", "schedule", "testdata", "golden_bytes.json"), encoding="utf-8") as f:
        golden = json.load(f)
    assert [(g["config"]["Policy"], g["config"]["Pin"]) for g in golden] == [
        ("random", "bytes"), ("solar", "bytes"), ("locality", "bytes"), ("locality", "samples")]
    for g in golden:
        c = g["config"]
        for r in range(c["Ranks"]):
            s = ScheduledSampler(c["N"], c["Batch"], seed=c["Seed"], policy=c["Policy"], drop_last=c["DropLast"],
                                 epochs=c["Epochs"], rank=r, ranks=c["Ranks"], ranks_per_node=c["RanksPerNode"],
                                 swarm_iterations=c["SwarmIterations"], binary=ddstore_bin, sizes=np.array(c["Sizes"]),
                                 capacity_bytes=c["CapacityBytes"], pin=c["Pin"])
            for e, ep in enumerate(g["epochs"]):
                s.set_epoch(e)
                assert list(s) == [step[r]["samples"] for step in ep["steps"]], (c["Policy"], r, e)
                hits = "".join("".join("." if h == "." else "H" for h in step[r]["hits"]) for step in ep["steps"])
                assert "".join("H" if h else "." for h in s.plan(e).hits) == hits, (c["Policy"], r, e)
