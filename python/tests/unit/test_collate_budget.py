"""The collates of samples that vary in size (Packed, Padded, Graphs) over
plain lists of samples, and BudgetSampler over given sizes: no agent."""

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import ddstore  # noqa: E402
from ddstore.torch import BudgetSampler, Graphs, Packed, Padded  # noqa: E402


def graph(n, e, seed):
    g = torch.Generator().manual_seed(seed)
    return {"x": torch.randn(n, 3, generator=g), "edge_index": torch.randint(0, max(n, 1), (2, e), generator=g),
            "y": torch.tensor(seed, dtype=torch.int64), "name": f"g{seed}"}


def test_graphs_follow_pyg_convention():
    gs = [graph(3, 4, 0), graph(0, 0, 1), graph(5, 2, 2), graph(2, 3, 3)]
    b = Graphs(edges={"edge_index": "x"})(gs)
    assert list(b) == ["x", "edge_index", "y", "name", "batch", "ptr"]
    assert torch.equal(b["x"], torch.cat([g["x"] for g in gs]))
    assert torch.equal(b["edge_index"], torch.cat([gs[0]["edge_index"], gs[1]["edge_index"],
                                                   gs[2]["edge_index"] + 3, gs[3]["edge_index"] + 8], 1))
    assert b["batch"].tolist() == [0, 0, 0, 2, 2, 2, 2, 2, 3, 3]
    assert b["ptr"].tolist() == [0, 3, 3, 8, 10] and b["y"].tolist() == [0, 1, 2, 3]
    assert b["name"] == ["g0", "g1", "g2", "g3"]
    # Graphs of one size (nothing varies in the batch) batch the same way.
    same = [graph(2, 2, k) for k in range(3)]
    b = Graphs(edges={"edge_index": "x"}, ptr=None, batch="graph")(same)
    assert "ptr" not in b and b["graph"].tolist() == [0, 0, 1, 1, 2, 2]
    assert b["edge_index"].shape == (2, 6) and torch.equal(b["edge_index"][:, 4:], same[2]["edge_index"] + 4)


@pytest.mark.parametrize("sizes", [[(3, 4), (0, 0), (5, 2), (2, 3)], [(2, 2), (2, 2), (2, 2)]])
def test_graphs_numpy_and_torch_paths_agree(sizes):
    """Fields in CPU memory are joined and shifted in numpy; others (here:
    needing grad, bfloat16) by torch: the same batch either way, for
    ragged fields (sizes that vary) and fixed ones (one size)."""
    gs = [graph(n, e, k) for k, (n, e) in enumerate(sizes)]
    for g in gs:
        g["edge_index"] = g["edge_index"].to(torch.int32)
        g["w"] = g["edge_index"].T.float()  # an edge field along axis 0, [e, 2]
    collate = Graphs(edges={"edge_index": "x", "w": "x"})
    plain = collate(gs)
    other = collate([{**g, "x": g["x"].to(torch.bfloat16), "w": g["w"].clone().requires_grad_()} for g in gs])
    assert plain["edge_index"].dtype == torch.int32
    assert plain["edge_index"].is_contiguous() and plain["w"].is_contiguous()
    for k in plain:
        if k == "name":
            continue
        assert torch.equal(plain[k].to(other[k].dtype), other[k].detach()), k
    first = np.cumsum([0] + [n for n, _ in sizes[:-1]])
    want = torch.cat([g["edge_index"] + int(f) for g, f in zip(gs, first)], 1)
    assert torch.equal(plain["edge_index"], want)
    if len(set(sizes)) > 1:  # ragged: along its varying axis (a fixed edge field goes along its last)
        assert torch.equal(plain["w"], want.T.float())


def test_graphs_long_runs_shifted_and_batched():
    """Graphs of hundreds of nodes and edges (the shift and the batch vector
    filled a run at a time), among them one without edges and one without
    nodes: the same batch as torch's cat and shift, on both paths."""
    sizes = [(180, 900), (0, 0), (250, 0), (130, 1400), (300, 2600)]
    gs = [graph(n, e, k) for k, (n, e) in enumerate(sizes)]
    for g in gs:
        g["edge_index"] = g["edge_index"].to(torch.int32)
    collate = Graphs(edges={"edge_index": "x"})
    plain = collate(gs)
    other = collate([{**g, "x": g["x"].clone().requires_grad_()} for g in gs])
    first = np.cumsum([0] + [n for n, _ in sizes[:-1]])
    want = torch.cat([g["edge_index"] + int(f) for g, f in zip(gs, first)], 1)
    assert torch.equal(plain["edge_index"], want) and torch.equal(other["edge_index"], want)
    batch = torch.cat([torch.full((n,), k, dtype=torch.int64) for k, (n, _) in enumerate(sizes)])
    assert torch.equal(plain["batch"], batch) and torch.equal(other["batch"], batch)
    assert plain["ptr"].tolist() == [0, 180, 180, 430, 560, 860]


@pytest.mark.parametrize("counts", [[], [0], [0, 0, 3], [1] * 50, [200, 0, 500, 130], [129] * 3 + [0] * 2,
                                    list(range(300))])
def test_runs_is_repeat(counts):
    from ddstore.torch.collate import _runs
    c = np.array(counts, np.int64)
    for dt in (np.int32, np.int64):
        v = (np.arange(c.shape[0]) * 7 - 3).astype(dt)
        got = _runs(v, c)
        assert got.dtype == dt and np.array_equal(got, np.repeat(v, c))


def test_graphs_bad_input():
    gs = [graph(3, 4, 0), graph(1, 1, 1)]
    with pytest.raises(ddstore.ArgumentError, match=r"edge field 'edges' not in the samples' fields"):
        Graphs(edges={"edges": "x"})(gs)
    with pytest.raises(ddstore.ArgumentError, match=r"a field 'y', the name of the batch's batch vector"):
        Graphs(edges={"edge_index": "x"}, batch="y")(gs)
    with pytest.raises(TypeError, match="want dict samples"):
        Graphs()([(torch.zeros(2),), (torch.zeros(3),)])
    with pytest.raises(TypeError, match="want a dict edge field"):
        Graphs(edges="edge_index")
    bad = [graph(3, 4, 0), {**graph(1, 1, 1), "x": torch.zeros(1, 3, dtype=torch.float64)}]
    with pytest.raises(ddstore.ArgumentError, match=r"field 'x' of sample 1 of the batch: torch.float64"):
        Graphs(edges={"edge_index": "x"})(bad)
    with pytest.raises(ddstore.ArgumentError, match="non-empty list"):
        Graphs()([])


def test_packed_and_padded():
    seqs = [(torch.arange(3), 1), (torch.arange(0), 2), (torch.arange(5) + 10, 3)]
    (vals, off), labels = Packed()(seqs)
    assert vals.tolist() == [0, 1, 2, 10, 11, 12, 13, 14] and off.tolist() == [0, 3, 3, 8]
    assert labels.tolist() == [1, 2, 3]
    (pad, lens), _ = Padded(value=-1)(seqs)
    assert lens.tolist() == [3, 0, 5]
    assert pad.tolist() == [[0, 1, 2, -1, -1], [-1] * 5, [10, 11, 12, 13, 14]]
    # Declared ragged: equal lengths in a batch still come packed.
    even = [(torch.arange(2), 0), (torch.arange(2), 1)]
    assert isinstance(Packed()(even)[0], torch.Tensor)
    (v, off), _ = Packed(ragged=[0])(even)
    assert off.tolist() == [0, 2, 4]
    # Along another axis: [2, e] edges padded along their last axis.
    e = [{"e": torch.ones(2, 3)}, {"e": torch.ones(2, 1)}]
    pad, lens = Padded()(e)["e"]
    assert pad.shape == (2, 2, 3) and lens.tolist() == [3, 1] and pad[1, :, 1:].abs().sum() == 0
    v, off = Packed()(e)["e"]
    assert v.shape == (2, 4) and off.tolist() == [0, 3, 4]
    with pytest.raises(ddstore.ArgumentError, match=r"differ in axes \[0, 1\]"):
        Packed()([torch.zeros(2, 2), torch.zeros(3, 3)])


def test_budget_sampler_batches():
    sizes = np.random.default_rng(0).integers(0, 50, 500)
    s = BudgetSampler(None, budget=200, sizes=sizes, seed=7)
    for epoch in range(3):
        s.set_epoch(epoch)
        batches = list(s)
        assert len(batches) == len(s)
        flat = [i for b in batches for i in b]
        assert sorted(flat) == list(range(500))  # one rank: each sample once
        assert all(sizes[b].sum() <= 200 for b in batches)
        # greedy: the next sample would not have fitted
        assert all(sizes[b].sum() + sizes[n[0]] > 200 for b, n in zip(batches, batches[1:]))
    # Deterministic: a sampler made again deals the same; another epoch another.
    t = BudgetSampler(None, budget=200, sizes=sizes, seed=7)
    t.set_epoch(2)
    assert list(t) == batches
    t.set_epoch(1)
    assert list(t) != batches
    assert list(BudgetSampler(None, budget=200, sizes=sizes, seed=7, shuffle=False))[0][:3] == [0, 1, 2]


def test_budget_sampler_ranks_padded_cost_and_resume():
    sizes = np.random.default_rng(1).integers(1, 30, 301)
    ranks = [BudgetSampler(None, budget=100, sizes=sizes, seed=3, rank=r, ranks=3) for r in range(3)]
    steps = {len(r) for r in ranks}
    assert len(steps) == 1  # every rank the same steps
    every = [i for r in ranks for b in r for i in b]
    assert set(every) == set(range(301)) and len(every) - 301 < 3 * max(len(b) for b in ranks[0].batches())
    dropped = [BudgetSampler(None, budget=100, sizes=sizes, seed=3, rank=r, ranks=3, drop_last=True) for r in range(3)]
    assert len(set(i for r in dropped for b in r for i in b)) == sum(len(b) for r in dropped for b in r)
    p = BudgetSampler(None, budget=100, sizes=sizes, cost="padded", max_samples=6, seed=3)
    for b in p:
        assert len(b) * sizes[b].max() <= 100 and len(b) <= 6
    # Resume mid-epoch: the rest is what an uninterrupted run yields.
    a = BudgetSampler(None, budget=100, sizes=sizes, seed=3, rank=1, ranks=3)
    a.set_epoch(4)
    full = list(a)
    it = iter(a)
    for _ in range(5):
        next(it)
    a.consumed(3)
    state = a.state_dict()
    assert state["step"] == 3 and state["epoch"] == 4
    with pytest.raises(ddstore.ArgumentError, match=r"seed 3 in the state, 0 here"):
        BudgetSampler(None, budget=100, sizes=sizes, seed=0, rank=1, ranks=3).load_state_dict(state)
    b = BudgetSampler(None, budget=100, sizes=sizes, seed=3, rank=1, ranks=3)
    b.load_state_dict(state)
    assert list(b) == full[3:]
    with pytest.raises(ddstore.ArgumentError, match=r"budget 100 in the state, 99 here"):
        BudgetSampler(None, budget=99, sizes=sizes, seed=3, rank=1, ranks=3).load_state_dict(state)
    other = sizes.copy()
    other[0] += 1
    with pytest.raises(ddstore.ArgumentError, match="sizes_digest"):
        BudgetSampler(None, budget=100, sizes=other, seed=3, rank=1, ranks=3).load_state_dict(state)


def test_budget_sampler_resumes_on_other_ranks():
    """Stopped after 2 steps on 3 ranks, resumed on 2: the batches of the
    epoch's list not yet delivered, dealt over 2, every sample once (the
    last round padded with the epoch's first batches)."""
    sizes = np.random.default_rng(2).integers(1, 30, 200)
    three = [BudgetSampler(None, budget=100, sizes=sizes, seed=5, rank=r, ranks=3) for r in range(3)]
    head = []
    for s in three:
        s.set_epoch(1)
        it = iter(s)
        head += [next(it), next(it)]
    state = json.loads(json.dumps(three[0].state_dict()))
    assert (state["format"], state["step"], state["position"]) == (2, 2, 6)
    every = BudgetSampler(None, budget=100, sizes=sizes, seed=5)._global(1)
    two = [BudgetSampler(None, budget=100, sizes=sizes, seed=5, rank=r, ranks=2) for r in range(2)]
    rest = []
    for s in two:
        s.load_state_dict(state)
        rest.append(list(s))
    assert len(rest[0]) == len(rest[1]) == -(-(len(every) - 6) // 2)
    got = sorted(i for b in head + rest[0] + rest[1] for i in b)
    pad = [i for b in every[:2 * len(rest[0]) - (len(every) - 6)] for i in b]
    assert got == sorted(list(range(200)) + pad)
    st2 = two[1].state_dict()
    assert st2["position"] == len(every) and st2["run_start"] == [1, 6]
    with pytest.raises(ddstore.ArgumentError, match="format 3 in the state"):
        two[0].load_state_dict({**state, "format": 3})
    with pytest.raises(ddstore.ArgumentError, match="step 1 with a state of ranks 3"):
        two[0].load_state_dict(state, step=1)


def test_budget_sampler_bad_input():
    with pytest.raises(ddstore.ArgumentError, match=r"BudgetSampler: sample 2 has size 9, above the budget 8"):
        BudgetSampler(None, budget=8, sizes=[1, 2, 9])
    with pytest.raises(ddstore.ArgumentError, match=r"BudgetSampler: sizes\[1\] = -1"):
        BudgetSampler(None, budget=8, sizes=[1, -1])
    with pytest.raises(ddstore.ArgumentError, match=r"BudgetSampler: budget 0: want an integer >= 1"):
        BudgetSampler(None, budget=0, sizes=[1])
    with pytest.raises(ddstore.ArgumentError, match="BudgetSampler: cost 'max'"):
        BudgetSampler(None, budget=8, sizes=[1], cost="max")
    with pytest.raises(ddstore.ArgumentError, match="tells no sizes: pass sizes="):
        BudgetSampler([1, 2], budget=8)
    with pytest.raises(ddstore.ArgumentError, match="3 sizes for a dataset of 2 samples"):
        BudgetSampler([1, 2], budget=8, sizes=[1, 1, 1])
