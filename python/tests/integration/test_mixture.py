"""MixtureDataset and MixtureSampler: several DistDatasets mixed by weights
or counts per epoch, with or without replacement, each source's samples
once per source epoch under its own schedule, deterministic from the seed,
the per-source counts of every epoch, resuming on another number of ranks,
and the errors of bad weights, counts, mismatched fields and states."""

import json

import pytest

torch = pytest.importorskip("torch")

import ddstore  # noqa: E402
from ddstore.torch import DistDataset, MixtureDataset, MixtureSampler, ThreadDataLoader  # noqa: E402
from conftest import run_steps  # noqa: E402
from torch.utils.data import TensorDataset  # noqa: E402


class Sized(torch.utils.data.Dataset):
    """n samples, each its own index."""

    def __init__(self, n, name):
        self.n, self.name = n, name

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return i


def mix(*sizes):
    return MixtureDataset([Sized(n, f"s{k}") for k, n in enumerate(sizes)], names=[f"s{k}" for k in
                                                                               range(len(sizes))])


def per_source(m, indices):
    """{source: [indices within it]}"""
    out = {n: [] for n in m.names}
    for i in indices:
        k, j = m.locate(i)
        out[m.names[k]].append(j)
    return out


def test_weights_split_every_batch(ddstore_bin):
    m = mix(64, 32)
    ss = [MixtureSampler(m, 8, weights=[3, 1], seed=4, rank=r, ranks=2, binary=ddstore_bin) for r in range(2)]
    assert ss[0].shares == [6, 2] and len(ss[0]) == 6  # 96 samples an epoch in global batches of 16
    e0 = run_steps(ss, 0)
    for step in e0:
        for b in step:
            got = per_source(m, b)
            assert len(got["s0"]) == 6 and len(got["s1"]) == 2
    flat = per_source(m, [x for st in e0 for b in st for x in b])
    # s0: 6 steps of 12 (both ranks) are its first epoch, 64 samples padded to 72; s1: 24 of its 32, distinct.
    assert len(flat["s0"]) == 72 and sorted(set(flat["s0"])) == list(range(64))
    assert len(flat["s1"]) == 24 and len(set(flat["s1"])) == 24
    assert ss[0].counts(0) == {"s0": 72, "s1": 24}
    # Deterministic from the seed; another seed, other batches.
    again = [MixtureSampler(m, 8, weights=[3, 1], seed=4, rank=r, ranks=2, binary=ddstore_bin) for r in range(2)]
    assert run_steps(again, 0) == e0
    other = [MixtureSampler(m, 8, weights=[3, 1], seed=5, rank=r, ranks=2, binary=ddstore_bin) for r in range(2)]
    assert run_steps(other, 0) != e0


def test_each_source_once_per_source_epoch(ddstore_bin):
    """Without replacement a source's stream is its schedule's epochs, one
    after another: each of its first n draws (all ranks) is every sample
    once."""
    m = mix(48, 24)
    ss = [MixtureSampler(m, 6, weights=[2, 1], seed=1, rank=r, ranks=2, binary=ddstore_bin) for r in range(2)]
    draws = {"s0": [], "s1": []}
    for e in range(3):
        for step in run_steps(ss, e):
            for name, xs in per_source(m, [x for b in step for x in b]).items():
                draws[name].append(xs)
    for name, n in (("s0", 48), ("s1", 24)):
        flat = [x for xs in draws[name] for x in xs]
        for k in range(len(flat) // n):
            assert sorted(flat[k * n:(k + 1) * n]) == list(range(n)), (name, k)


def test_counts_exact(ddstore_bin):
    m = mix(40, 40)
    ss = [MixtureSampler(m, 4, counts=[48, 16], seed=2, rank=r, ranks=2, binary=ddstore_bin) for r in range(2)]
    assert ss[0].shares == [3, 1] and len(ss[0]) == 8
    got = per_source(m, [x for st in run_steps(ss, 1) for b in st for x in b])
    assert len(got["s0"]) == 48 and len(got["s1"]) == 16
    assert ss[1].counts(1) == {"s0": 48, "s1": 16}


def test_with_replacement(ddstore_bin):
    m = mix(10, 1000)
    ss = [MixtureSampler(m, 10, weights=[1, 1], seed=3, replacement=True, rank=r, ranks=2, binary=ddstore_bin)
          for r in range(2)]
    e = run_steps(ss, 0)
    assert len(e) == 51
    small = per_source(m, [x for st in e for b in st for x in b])["s0"]
    assert len(small) == 51 * 10 and set(small) == set(range(10))  # each drawn many times
    assert run_steps([MixtureSampler(m, 10, weights=[1, 1], seed=3, replacement=True, rank=r, ranks=2,
                               binary=ddstore_bin) for r in range(2)], 0) == e


@pytest.mark.parametrize("replacement", [False, True])
def test_resume_on_other_ranks(ddstore_bin, replacement):
    """Stop a 4-rank mixture after 3 steps, resume on 2 ranks with a batch
    twice as large: the epoch goes on with the samples it has left, each
    source from where it stopped (without replacement: every source's
    samples of its epoch once)."""
    m = mix(64, 64)
    kw = dict(weights=[1, 1], seed=6, replacement=replacement, binary=ddstore_bin)
    four = [MixtureSampler(m, 4, rank=r, ranks=4, **kw) for r in range(4)]
    head = run_steps(four, 0, steps=3)
    state = json.loads(json.dumps(four[0].state_dict()))
    assert state["position"] == 48 and [s["position"] for s in state["sources"]] == ([24, 24] if not replacement
                                                                                    else [0, 0])
    two = [MixtureSampler(m, 8, rank=r, ranks=2, **kw) for r in range(2)]
    for s in two:
        s.load_state_dict(state)
    assert len(two[0]) == 5  # 80 samples left in global batches of 16
    rest = run_steps(two, 0)
    assert len(rest) == 5
    flat = per_source(m, [x for run_ in (head, rest) for st in run_ for b in st for x in b])
    assert len(flat["s0"]) == len(flat["s1"]) == 64
    if not replacement:
        assert sorted(flat["s0"]) == list(range(64)) and sorted(flat["s1"]) == list(range(64))
    assert two[0].state_dict()["position"] == 128
    with pytest.raises(ValueError, match="seed 6 in the state, 7 here"):
        MixtureSampler(m, 8, rank=0, ranks=2, **{**kw, "seed": 7}).load_state_dict(state)


@pytest.mark.parametrize("kw,want", [
    (dict(weights=[1, -1]), r"weights\[1\] = -1 \(source 's1'\): want a finite number >= 0"),
    (dict(weights=[0, 0]), r"weights \[0.0, 0.0\] sum to 0"),
    (dict(weights=[1]), r"weights \[1\]: 1 for 2 sources"),
    (dict(weights=[1, float("nan")]), r"weights\[1\] = nan"),
    (dict(weights=[1, "a"]), r"weights\[1\] = 'a'"),
    (dict(weights=[100, 1]), "weight 1.0 of source 's1' gives it 0 of batch_size 4 samples a step"),
    (dict(counts=[15, 5]), r"counts \[15, 5\] sum to 20, not a multiple of ranks 2 × batch_size 4 = 8"),
    (dict(counts=[5, 3]), r"counts \[5, 3\]: batch_size 4 × count / 8 is not whole"),
    (dict(counts=[1.5, 2]), r"counts\[0\] = 1.5"),
    (dict(weights=[1, 1], counts=[8, 8]), "weights and counts: give one of them"),
    (dict(policy="solar"), "policy 'solar'"),
])
def test_bad_input(ddstore_bin, kw, want):
    with pytest.raises(ValueError, match=want):
        MixtureSampler(mix(40, 40), 4, ranks=2, rank=0, binary=ddstore_bin, **kw)


def test_bad_states(ddstore_bin):
    m = mix(40, 40)
    s = MixtureSampler(m, 4, weights=[1, 1], ranks=2, rank=0, binary=ddstore_bin)
    st = s.state_dict()
    for change, want in ((dict(format=2), "format 2 of kind 'mixture' in the state"),
                         (dict(weights=[2.0, 1.0]), r"weights \[2.0, 1.0\] in the state, \[1.0, 1.0\] here"),
                         (dict(position=81), "position 81"),
                         (dict(sources=st["sources"][:1]), "want 2 of them")):
        with pytest.raises(ValueError, match=want):
            s.load_state_dict({**st, **change})
    bad = json.loads(json.dumps(st))
    bad["sources"][1]["n"] = 41
    with pytest.raises(ValueError, match="source 1: n 41 in the state, 40 here"):
        s.load_state_dict(bad)


# -- over DistDatasets, through the loader --------------------------------------------

@pytest.fixture
def store(job):
    s = ddstore.Store()
    yield s
    s.close()


def test_mixture_of_dist_datasets(store):
    a = DistDataset(TensorDataset(torch.arange(30, dtype=torch.float32).reshape(30, 1), torch.arange(30)), "ma",
                    store=store)
    b = DistDataset(TensorDataset(torch.arange(20, dtype=torch.float32).reshape(20, 1) + 100,
                                  torch.arange(20) + 100), "mb", store=store)
    m = MixtureDataset([a, b])
    assert m.names == ["ma", "mb"] and len(m) == 50
    s = MixtureSampler(m, 5, weights=[3, 2], seed=1)
    loader = ThreadDataLoader(m, batch_sampler=s, num_workers=2)
    got = []
    for k, (x, y) in enumerate(loader):
        assert torch.equal(x[:, 0], y.float())  # the rows of the planned samples, both sources
        got.append(y.tolist())
        if k == 3:
            state = json.loads(json.dumps(loader.state_dict()))
            break
    assert state["dataset"] == {"format": 1, "names": ["ma", "mb"], "lengths": [30, 20]}
    s2 = MixtureSampler(m, 5, weights=[3, 2], seed=1)
    l2 = ThreadDataLoader(m, batch_sampler=s2)
    l2.load_state_dict(state)
    rest = [y.tolist() for _, y in l2]
    flat = [v for b in got + rest for v in b]
    assert len(got + rest) == 10 and sorted(v for v in flat if v < 100) == list(range(30))
    assert sorted(v for v in flat if v >= 100) == list(range(100, 120))

    c = DistDataset(TensorDataset(torch.zeros(10, 2), torch.arange(10)), "mc", store=store)
    with pytest.raises(ValueError, match=r"field 0: sample shape \(2,\) in source 'mc', \(1,\) in source 'ma'"):
        MixtureDataset([a, c])
    d = DistDataset(TensorDataset(torch.zeros(10, 1)), "md", store=store)
    with pytest.raises(ValueError, match=r"source 'md' has fields \[0\], source 'ma' \[0, 1\]"):
        MixtureDataset([a, d])
