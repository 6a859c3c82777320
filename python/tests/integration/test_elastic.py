"""Resuming on another number of ranks: ScheduledSampler's state (seed,
epoch, position in the epoch's global order), loaded by the samplers of a
job of other ranks, nodes and local batch, deals the samples the stopped job
did not deliver, each once; ThreadDataLoader's and DistDataset's state
(torchdata's protocol) around it; the errors of states of something else."""

import json

import pytest

torch = pytest.importorskip("torch")

import ddstore  # noqa: E402
from ddstore.schedule import permutation  # noqa: E402
from ddstore.torch import DistDataset, ScheduledSampler, ThreadDataLoader  # noqa: E402
from torch.utils.data import TensorDataset  # noqa: E402
from conftest import run_steps  # noqa: E402

POLICIES = ["locality", "random", "solar"]


def samplers(bin_, n, batch, ranks, rpn=1, **kw):
    return [ScheduledSampler(n, batch, rank=r, ranks=ranks, ranks_per_node=rpn, binary=bin_, **kw)
            for r in range(ranks)]


def check_once(n, delivered, perm):
    """delivered (sample indices of one epoch, over the runs) holds every
    sample, and more only where padding repeats the epoch's head."""
    count = [0] * n
    for x in delivered:
        count[x] += 1
    assert min(count) >= 1, [i for i, c in enumerate(count) if c == 0]
    extra = sorted(x for x in range(n) for _ in range(count[x] - 1))
    assert extra == sorted(perm[:len(delivered) - n]), "repeats other than the padding"


@pytest.mark.parametrize("policy", POLICIES)
def test_four_ranks_then_two_then_three(ddstore_bin, policy):
    """Stop a 4-rank job after 2 steps of epoch 1, resume on 2 ranks (a
    local batch twice as large: the same global batch), stop after 2
    steps, resume on 3: every sample of epoch 1 delivered once (padding
    aside), every rank the same steps, local batches equal (locality); the
    states survive JSON; epoch 2 is the 3-rank job's."""
    n, seed = 96, 5
    kw = dict(seed=seed, policy=policy, capacity=48, epochs=4, swarm_iterations=20)
    four = samplers(ddstore_bin, n, 4, 4, rpn=2, **kw)
    first = run_steps(four, 1, steps=2)
    state = json.loads(json.dumps(four[2].state_dict()))
    assert (state["epoch"], state["step"], state["position"], state["format"]) == (1, 2, 32, 2)
    assert all(s.state_dict() == state for s in four)  # the same on every rank

    two = samplers(ddstore_bin, n, 8, 2, **kw)
    for s in two:
        s.load_state_dict(state)
    second = run_steps(two, 1, steps=2)
    state2 = json.loads(json.dumps(two[1].state_dict()))
    assert (state2["epoch"], state2["step"], state2["position"], state2["run_start"]) == (1, 2, 64, [1, 32])

    three = samplers(ddstore_bin, n, 4, 3, **kw)
    for s in three:
        s.load_state_dict(state2)
    assert len(three[0]) == 3  # 32 samples left in global batches of 12: the last one padded
    third = run_steps(three, 1)
    assert len(third) == 3
    for run, b in ((first, 4), (second, 8), (third, 4)):
        if policy == "locality":
            assert all(len(x) == b for step in run for x in step)
        elif policy == "random":  # DistributedSampler's: the last step may be short, the same on every rank
            assert all(len({len(x) for x in step}) == 1 for step in run)
    order = 1
    if policy == "solar":
        order = three[0].plan(1, hits=False).epoch  # the run position; its permutation is the job's order
        import subprocess
        out = subprocess.run([ddstore_bin, "schedule", "--n", str(n), "--ranks", "4", "--batch", "4", "--epochs",
                              "4", "--capacity", "48", "--policy", "solar", "--seed", str(seed), "--iterations",
                              "20", "--json"], check=True, capture_output=True, text=True)
        order = json.loads(out.stdout)["epoch_order"][1]
    perm = permutation(seed, order, n).tolist()
    delivered = [x for run in (first, second, third) for step in run for b in step for x in b]
    check_once(n, delivered, perm)
    # Each step is the next positions of the epoch's global order.
    at = 0
    for run in (first, second, third):
        for step in run:
            g = [x for b in step for x in b]
            assert sorted(g) == sorted((perm + perm)[at:at + len(g)])
            at += len(g)
    # The epoch after: a 3-rank job's (solar keeps the 4-rank job's order).
    fresh = samplers(ddstore_bin, n, 4, 3, **kw)
    if policy == "solar":
        assert three[0].order_ranks == 4
        got = run_steps(three, 2)
        assert sorted(x for st in got for b in st for x in b) == sorted(
            permutation(seed, json.loads(out.stdout)["epoch_order"][2], n).tolist())
    else:
        assert run_steps(three, 2) == run_steps(fresh, 2)
    with pytest.raises(ValueError, match="epoch 0 before epoch 1, where this run resumed"):
        three[0].set_epoch(0)


def test_locality_hit_rate_after_restart(ddstore_bin):
    """The pinned set is recomputed for the new nodes: from the first whole
    epoch after the restart, C/N of the reads are memory hits."""
    n = 96
    four = samplers(ddstore_bin, n, 4, 4, rpn=2, seed=1, capacity=48)
    run_steps(four, 0, steps=1)
    state = four[0].state_dict()
    three = samplers(ddstore_bin, n, 4, 3, rpn=3, seed=1, capacity=48)
    for s in three:
        s.load_state_dict(state)
    hits = sum(int(s.plan(1).hits.sum()) for s in three)
    reads = sum(s.plan(1).samples.shape[0] for s in three)
    assert reads == n and hits * 2 == n


def test_same_geometry_goes_on_with_the_saved_plan(ddstore_bin):
    """Resumed on the same ranks and batch, a run that had itself resumed
    on another geometry goes on with its own plan, step for step."""
    n = 60
    a = samplers(ddstore_bin, n, 3, 4, seed=2, policy="random", capacity=20)
    run_steps(a, 0, steps=1)
    st = a[0].state_dict()
    b = samplers(ddstore_bin, n, 5, 2, seed=2, policy="random", capacity=20)
    for s in b:
        s.load_state_dict(st)
    head = run_steps(b, 0, steps=2)
    st2 = b[0].state_dict()
    rest = [[b_.plan(0, hits=False).batch(k).tolist() for b_ in b] for k in range(2, len(b[0]))]
    c = samplers(ddstore_bin, n, 5, 2, seed=2, policy="random", capacity=20)
    for s in c:
        s.load_state_dict(st2)
    assert c[0]._start == 2 and run_steps(c, 0) == rest
    assert len(head) == 2 and len(rest) == 3  # 48 left over 2 ranks of 5: 5 steps, the last short


@pytest.mark.parametrize("change,want", [
    (dict(format=3), "format 3 in the state: want 1 or 2"),
    (dict(seed=9), "seed 9 in the state, 0 here"),
    (dict(n=41), "n 41 in the state, 40 here: the state is of another dataset"),
    (dict(dataset="other"), "dataset 'other' in the state, 'mine' here"),
    (dict(position=41), r"position 41: want an integer <= 40"),
    (dict(position=-1), "position -1"),
    (dict(step=1), "step 1 and position 0 in the state disagree"),
    (dict(policy="random"), "policy 'random' in the state, 'locality' here"),
    (dict(run_start=[1]), r"run_start \[1\] in the state: want \[epoch, position\]"),
])
def test_bad_states(ddstore_bin, change, want):
    class FakeStore:
        rank, size, local_size = 0, 1, 1

    class Named(torch.utils.data.Dataset):
        name, store = "mine", FakeStore()

        def __len__(self):
            return 40

    s = ScheduledSampler(Named(), 4, binary=ddstore_bin)
    state = {**s.state_dict(), **change}
    with pytest.raises(ValueError, match=want):
        s.load_state_dict(state)
    with pytest.raises(ValueError, match="state without position"):
        s.load_state_dict({k: v for k, v in s.state_dict().items() if k != "position"})
    other = ScheduledSampler(Named(), 2, ranks=1, binary=ddstore_bin)
    with pytest.raises(ValueError, match="step 1 with a state of batch_size 4"):
        other.load_state_dict(s.state_dict(), step=1)


def test_state_of_format_1(ddstore_bin):
    """A state of the earlier format (a step, no position) resumes the
    same plan; of another one, it is refused naming the field."""
    s = ScheduledSampler(40, 4, seed=3, binary=ddstore_bin)
    v1 = {k: v for k, v in s.state_dict(step=3).items() if k not in ("format", "position", "run_start",
                                                                      "order_ranks", "dataset")}
    t = ScheduledSampler(40, 4, seed=3, binary=ddstore_bin)
    t.load_state_dict(v1)
    assert t.state_dict()["position"] == 12
    with pytest.raises(ValueError, match="batch_size 4 in the state, 2 here"):
        ScheduledSampler(40, 2, seed=3, binary=ddstore_bin).load_state_dict(v1)


# -- the loader and the dataset -----------------------------------------------------

@pytest.fixture
def store(job):
    s = ddstore.Store()
    yield s
    s.close()


def test_thread_loader_state(store):
    """ThreadDataLoader's state is after the batches the consumer got (its
    workers fetched ahead); a new loader with other workers, and a sampler
    of another local batch, goes on from there; the dataset's state names
    it."""
    n = 48
    src = TensorDataset(torch.arange(n, dtype=torch.float32), torch.arange(n))
    ds = DistDataset(src, "el", store=store)
    s = ScheduledSampler(ds, 4, seed=3)
    loader = ThreadDataLoader(ds, batch_sampler=s, num_workers=3, prefetch_factor=2)
    got = []
    for k, b in enumerate(loader):
        got.append(b[1].tolist())
        if k == 2:
            state = json.loads(json.dumps(loader.state_dict()))
            break
    assert state["sampler"]["step"] == 3 and state["sampler"]["position"] == 12 and s._pos > 3
    assert state["dataset"] == {"format": 1, "name": "el", "n": n, "fields": ["0", "1"]}
    assert state["sampler"]["dataset"] == "el"
    t = ScheduledSampler(ds, 6, seed=3)
    l2 = ThreadDataLoader(ds, batch_sampler=t, num_workers=1)
    l2.load_state_dict(state)
    rest = [b[1].tolist() for b in l2]
    assert [len(b) for b in rest] == [6] * 6
    assert sorted(x for b in got + rest for x in b) == list(range(n))
    assert l2.state_dict()["sampler"]["position"] == n
    with pytest.raises(ValueError, match="name 'other' in the state, 'el' here"):
        ds.load_state_dict({**state["dataset"], "name": "other"})
    with pytest.raises(ValueError, match="n 47 in the state, 48 here"):
        ds.load_state_dict({**state["dataset"], "n": 47})


def test_thread_loader_state_without_a_stateful_sampler():
    """A sampler without a state: the loader counts the batches and skips
    them on load (a deterministic sampler resumes exactly)."""
    data = list(range(20))
    loader = ThreadDataLoader(data, batch_size=3, num_workers=2)
    it = iter(loader)
    head = [next(it).tolist() for _ in range(2)]
    state = loader.state_dict()
    assert state["batches"] == 2 and state["sampler"] is None
    l2 = ThreadDataLoader(data, batch_size=3)
    l2.load_state_dict(state)
    assert [b.tolist() for b in l2] == [list(range(i, min(i + 3, 20))) for i in range(6, 20, 3)]
    assert head == [[0, 1, 2], [3, 4, 5]]
    with pytest.raises(ValueError, match="want the dict of state_dict"):
        l2.load_state_dict({"format": 7})


def test_iterator_state_protocol(ddstore_bin):
    """The iterator of a pass has state_dict/load_state_dict (what torchdata's
    StatefulDataLoader saves of a sampler): its state is after the batches it
    yielded, and loading one repositions it."""
    s = ScheduledSampler(40, 4, seed=2, binary=ddstore_bin)
    s.set_epoch(1)
    want = list(s)
    it = iter(s)
    next(it), next(it), next(it)
    st = it.state_dict()
    assert (st["epoch"], st["step"], st["position"]) == (1, 3, 12)
    fresh = ScheduledSampler(40, 4, seed=2, binary=ddstore_bin)
    it2 = iter(fresh)
    it2.load_state_dict(st)
    assert list(it2) == want[3:]
