"""Module locks of the client are new in a forked child: a lock another
thread of the parent held at the fork would stay held in the child's copy."""

import os
import threading
import time

from ddstore import _fence


def _child_exits(pid, within_s=20.0):
    """Whether child pid exited with status 0 within within_s (killed
    otherwise)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status) == 0
        time.sleep(0.01)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    return False


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
        assert _child_exits(pid), "the child could not take the fence's sequence lock"
    finally:
        release.set()
        t.join()
