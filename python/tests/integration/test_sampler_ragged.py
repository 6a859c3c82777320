"""ScheduledSampler over a ragged variable of a real store: sizes="name"
takes the rows' sizes from the store (ragged_sizes times the bytes of a
unit), and plans exactly what the sizes passed by hand plan."""

import numpy as np
import pytest

pytest.importorskip("torch")
import ddstore  # noqa: E402
from ddstore.torch import ScheduledSampler  # noqa: E402


class RaggedRows:
    """A store-backed dataset of the rows of one ragged variable."""

    def __init__(self, store, name):
        self.store, self.name = store, name
        self.n = store.info(name)[0]

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return self.store.get_ragged_row(self.name, i)


@pytest.fixture
def store(job):
    s = ddstore.Store()
    yield s
    s.close()


def test_sizes_from_a_ragged_variable(store, ddstore_bin):
    rng = np.random.default_rng(4)
    atoms = np.exp(rng.uniform(np.log(8), np.log(256), 500)).round().astype(np.int64)  # structures of 8..256 atoms
    store.add_ragged("pos", np.zeros((int(atoms.sum()), 3), np.float32), atoms)
    ds = RaggedRows(store, "pos")
    unit = 3 * 4  # a unit: one atom's 3 float32
    budget = int(atoms.sum()) * unit // 4
    s = ScheduledSampler(ds, 8, seed=9, sizes="pos", capacity_bytes=budget, binary=ddstore_bin)
    by_hand = ScheduledSampler(500, 8, seed=9, sizes=atoms * unit, capacity_bytes=budget, binary=ddstore_bin)
    assert s.sizes_digest == by_hand.sizes_digest and (s.rank, s.ranks) == (0, 1)
    for e in range(2):
        p, q = s.plan(e), by_hand.plan(e)
        assert p.samples.tolist() == q.samples.tolist() and p.hits.tolist() == q.hits.tolist()
        assert p.bytes.tolist() == [int(atoms[p.batch(k)].sum()) * unit for k in range(p.steps)]
        # The rows the loader reads are the planned ones, of the sizes planned.
        s.set_epoch(e)
        first = next(iter(s))
        assert sum(ds[i].nbytes for i in first) == p.bytes[0]
    hit = [p.hits[p.offsets[k]:p.offsets[k + 1]] for k in range(p.steps)]
    assert sum(int(atoms[p.batch(k)][h].sum()) * unit for k, h in enumerate(hit)) <= budget
