"""The row geometry the Python client shares with the Go one (Go's
layout.Row.Validate), checked against the vectors of testdata/rules.json
through a real agent: the client checks a shard's shape before it creates
it, and the agent checks it again."""

import json
import os

import pytest

import ddstore
from ddstore._errors import Error, from_status

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

with open(os.path.join(ROOT, "testdata", "rules.json"), encoding="utf-8") as f:
    V = json.load(f)


@pytest.fixture
def store(job):
    s = ddstore.Store(rank=0, size=1)
    yield s
    s.close()


def test_geometry(store):
    """Store.init of shards of no rows: refused with Go's code, or made with
    the geometry asked for."""
    for i, case in enumerate(V["geometry"]):
        name = f"g{i}"
        if case["code"]:
            with pytest.raises(Error) as e:
                store.init(name, 0, case["disp"], case["itemsize"])
            assert type(e.value) is type(from_status(case["code"], "")), case
            continue
        store.init(name, 0, case["disp"], case["itemsize"])
        assert store.info(name)[1:] == (case["disp"], case["itemsize"])
        store.free(name)
