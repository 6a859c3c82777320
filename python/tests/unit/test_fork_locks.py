"""Module locks of the client are new in a forked child: a lock another
thread of the parent held at the fork would stay held in the child's copy."""

import os
import threading

from conftest import wait_until
from ddstore import _fence


def test_fence_sequence_after_fork_with_lock_held():
    held, release = threading.Event(), threading.Event()

    def hold():
        with _fence._SEQS_LOCK:
            held.set()
            release.wait()

    t = threading.Thread(target=hold)
    t.start()
    try:
        assert held.wait(10)
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                n = _fence.next_seq(("ns", "agent", "group-of-the-child"))
                code = 0 if n == 1 else 2
            finally:
                os._exit(code)
        status = []

        def exited():
            done, st = os.waitpid(pid, os.WNOHANG)
            if done:
                status.append(st)
            return bool(done)

        try:
            wait_until(exited, 20, "the forked child taking the fence's sequence lock")
        finally:
            if not status:
                os.kill(pid, 9)
                os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status[0]) == 0
    finally:
        release.set()
        t.join()
