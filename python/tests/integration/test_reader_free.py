"""A reader store (split mode) while the job frees a variable and adds it
again with new content: its mappings of the old segments stay readable
after the agents unlink them, and it takes no part in the Free. It must
never return the freed variable's rows once the new add() has returned,
and must read the new ones without being reopened."""

from conftest import run_ranks

SCRIPT = r"""
import sys, threading, time
import numpy as np
import ddstore

s = ddstore.Store()
rank = s.rank
assert s.size == 2
ROWS, DISP = 6, 3                       # rank r's rows: [6r, 6r + 6), rank 0's on node a
LENGTHS = [[2, 0, 3, 1, 2, 4], [1, 3, 0, 2, 5, 1]]


def fixed(gen, idx):
    # Row g of generation gen: gen * 10**6 + 10 * g + column.
    idx = np.asarray(idx, dtype=np.int64)
    return gen * 10**6 + 10 * idx[:, None] + np.arange(DISP)[None, :]


def ragged(gen, idx):
    first = [0, sum(LENGTHS[0])]
    vals = []
    for g in idx:
        r, l = divmod(g, ROWS)
        vals.append(gen * 10**6 + 10 * g + np.arange(LENGTHS[r][l], dtype=np.int64))
    return np.concatenate(vals) if vals else np.empty(0, np.int64)


def add(gen):
    own = list(range(ROWS * rank, ROWS * rank + ROWS))
    s.add("x", fixed(gen, own))
    s.add_ragged("rg", ragged(gen, own), LENGTHS[rank])


def barrier(name):                      # add() is a collective: it returns once every rank's has
    s.add(name, np.zeros((1, 1), np.int64))


def gen_of(got, want):
    for gen in (1, 2):
        if np.array_equal(got, want(gen)):
            return gen
    return 0


add(1)
if rank == 0:
    rd = ddstore.Store(rank=0, size=1, spawn=False, reader=True)
    local, remote, both = [0, 5, 2], [6, 11, 8], [11, 1, 7, 0]
    state = {"added": False, "stop": False, "calls": 0, "after": 0, "bad": []}

    def one(k):
        kind = k % 6
        if kind < 3:
            idx = [local, remote, both][kind]
            out = np.empty((len(idx), DISP), np.int64)
            rd.get_batch("x", out, idx)
            return gen_of(out, lambda gen: fixed(gen, idx))
        if kind == 3:
            out = np.empty((3, DISP), np.int64)            # node-local rows of one shard: get()'s fast path
            rd.get("x", out, 1)
            return gen_of(out, lambda gen: fixed(gen, [1, 2, 3]))
        idx = [[0, 2, 3, 5], [6, 7, 10, 4, 9]][kind - 4]  # rows of some length, local, then both nodes
        vals, lengths = rd.get_ragged("rg", idx)
        assert list(lengths) == [LENGTHS[g // ROWS][g % ROWS] for g in idx]
        return gen_of(vals, lambda gen: ragged(gen, idx))

    def loop():
        k = 0
        while not state["stop"]:
            k += 1
            after = state["added"]
            try:
                gen, err = one(k), None
            except ddstore.Error as e:
                gen, err = None, e
            state["calls"] += 1
            if after and err is not None:
                state["bad"].append(f"a read begun after the new add returned failed: {err!r}")
            elif after and gen != 2:
                state["bad"].append(f"a read begun after the new add returned got generation {gen}")
            elif after:
                state["after"] += 1
            elif err is not None and not isinstance(err, (ddstore.FreedVariable, ddstore.UnknownVariable)):
                state["bad"].append(f"a read while the variable was freed: {err!r}")
            elif err is None and gen not in (1, 2):
                state["bad"].append(f"rows of no generation ({gen})")

    assert one(0) == 1 and one(3) == 1 and one(4) == 1
    t = threading.Thread(target=loop)
    t.start()

    def wait_for(cond, what):
        deadline = time.monotonic() + 30
        while not cond():
            if state["bad"] or time.monotonic() > deadline:
                state["stop"] = True
                t.join()
                raise AssertionError(f"{what}: {state['calls']} reads, {state['bad'][:5]}")
            time.sleep(0.005)

    wait_for(lambda: state["calls"] >= 30, "reads of the first variable")
barrier("before-free")
s.free("x")
s.free("rg")
barrier("freed")                         # every rank's free has returned: the segments are dropped
add(2)
if rank == 0:
    state["added"] = True
    wait_for(lambda: state["after"] >= 30, "reads of the new variable")
    state["stop"] = True
    t.join()
    assert not state["bad"], state["bad"][:5]
    assert rd.info("x") == (2 * ROWS, DISP, 8)
    rd.close()
    print("reader", state["calls"], state["after"])
barrier("done")                          # rank 1 serves its rows until the reader is done
s.close()
print("ok", rank)
"""


def test_reader_after_free_and_add(job):
    outs = run_ranks(SCRIPT, ["a", "b"], job, timeout=120)
    assert outs[0].split()[0] == "reader" and int(outs[0].split()[2]) >= 30, outs
    assert [o.split()[-2:] for o in outs] == [["ok", "0"], ["ok", "1"]], outs
