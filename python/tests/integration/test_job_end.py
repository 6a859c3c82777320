"""A training job's rank leaves its gloo process group (ddstore_bench's
end_rank) and exits although a worker thread of the group still holds a
finished collective's tensor, which only Python owns: two real ranks, a real
DDP model. Were the group's last reference the model's reducer (the model
freed after destroy_process_group), the group's destructor would join that
worker holding the GIL the worker waits for, and the rank would never exit."""

import os
import socket

import pytest

from conftest import run_ranks

pytest.importorskip("torch")

SCRIPT = r"""
import datetime, os, sys, time
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from ddstore_bench._job import end_rank

rank, done = int(os.environ["DDSTORE_RANK"]), sys.argv[1]
os.environ.update(RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[2])
dist.init_process_group("gloo")
# The model's group: one whose collectives time out soon (the ranks are
# both here by now, as new_group is collective).
group = dist.new_group(timeout=datetime.timedelta(seconds=2))
model = DDP(torch.nn.Linear(2, 1), process_group=group)
if rank == 0:
    # A collective the other rank never joins: a worker of the group runs it
    # until its timeout, then drops the tensor, whose Python object is gone
    # by then (neither the tensor nor the work is kept here).
    dist.all_reduce(torch.ones(4), group=group, async_op=True)
    del group
    end_rank([model])
    del model  # the reducer's reference to the group goes here, when end_rank leaves it
    open(done, "w").close()
    print("ok 0", flush=True)
else:
    deadline = time.monotonic() + 120
    while not os.path.exists(done):  # rank 0's end, polled with a deadline
        if time.monotonic() > deadline:
            sys.exit("rank 1: rank 0 did not end within 120 s")
        time.sleep(0.01)
    del group
    end_rank([model])
    print("ok 1", flush=True)
"""


def test_rank_exits_with_a_collective_still_in_a_worker(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    done = str(tmp_path / "rank0-done")
    outs = run_ranks(SCRIPT, ["n0", "n1"], {}, timeout=60, args=(done, str(port)))
    assert [o.strip().splitlines()[-1] for o in outs] == ["ok 0", "ok 1"], outs
    assert os.path.exists(done)
