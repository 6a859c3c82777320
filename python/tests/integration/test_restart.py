"""An agent killed (SIGKILL) and started again re-adopts its segments; the
Python client's open Store goes on by itself: new lanes, receive buffers
registered again, rows of the backing file read through the new agent."""

import os
import signal
import subprocess
import time

import numpy as np

import ddstore


def _start(job, *extra):
    return subprocess.Popen([job["DDSTORE_BIN"], "agent", "--namespace", job["DDSTORE_NAMESPACE"], "--node", "n0",
                             "--run-dir", job["DDSTORE_RUN_DIR"], *extra], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)


def _wait_socket(job, timeout=20):
    sock = os.path.join(job["DDSTORE_RUN_DIR"], f"{job['DDSTORE_NAMESPACE']}.n0.sock")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        r = subprocess.run([job["DDSTORE_BIN"], "info", "--namespace", job["DDSTORE_NAMESPACE"], "--node", "n0",
                            "--run-dir", job["DDSTORE_RUN_DIR"]], capture_output=True)
        if r.returncode == 0:
            return sock
        time.sleep(0.05)
    raise AssertionError("the agent did not come up")


def test_agent_restart(job, tmp_path, monkeypatch):
    monkeypatch.setenv("DDSTORE_NODE_ID", "n0")
    data = np.arange(200 * 4, dtype=np.int64).reshape(200, 4)
    f = tmp_path / "d.npy"
    np.save(f, data)
    p = _start(job)
    try:
        _wait_socket(job)
        s = ddstore.Store(rank=0, size=1, spawn=False)
        s.add("x", data[:50], backing=str(f), total=200)
        buf = s.alloc_recv((8, 4), np.int64)
        idx = [199, 3, 150, 60, 49, 50, 120, 0]
        s.get_batch("x", buf, idx)
        assert np.array_equal(buf, data[idx])
        p.send_signal(signal.SIGKILL)
        p.wait()
        p = _start(job)
        _wait_socket(job)
        # Rows of the file go through the new agent, into the same buffer.
        s.get_batch("x", buf, idx[::-1])
        assert np.array_equal(buf, data[idx[::-1]])
        out = np.empty((8, 4), np.int64)
        s.get_batch("x", out, idx)
        assert np.array_equal(out, data[idx])
        s.add("y", data[:5])  # collectives work again
        r = ddstore.Store(rank=0, size=1, spawn=False, reader=True)
        assert r.describe("x")["held_rows"] == 50  # re-adopted, not reloaded
        r.close()
        s.close()
    finally:
        p.send_signal(signal.SIGTERM)
        p.wait()
