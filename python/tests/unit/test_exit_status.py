"""The Python client decides on the exit status of the `ddstore` binary it
runs, never on its stderr: binaries that write one kind's text and exit with
another's (shell scripts standing in for `ddstore`) raise the status's
exception. Needs no agent and no ddstore binary."""

import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))

import ddstore  # noqa: E402
from ddstore import _agent, _errors  # noqa: E402
from ddstore.sampler import read_plan  # noqa: E402


def fake_binary(tmp_path, status, stderr):
    b = tmp_path / "ddstore"
    b.write_text(f"#!/bin/sh\nprintf '%s\\n' '{stderr}' >&2\nexit {status}\n")
    b.chmod(0o755)
    return str(b)


ARGS = ["schedule", "--emit-rank", "0", "--epoch", "0"]


@pytest.mark.parametrize("status,stderr,cls", [
    (_errors.EXIT_KIND + 12, "the plan cannot be made", ddstore.ArgumentError),
    (_errors.EXIT_KIND + 2, "ddstore: bad argument: text of another kind", ddstore.GeometryError),
    (1, "ddstore: bad argument: an exit status of no kind", ddstore.InternalError),
    (_errors.EXIT_KIND + 13, "ddstore: bad argument: internal, whatever it says", ddstore.InternalError),
])
def test_read_plan_raises_the_status_kind(tmp_path, status, stderr, cls):
    with pytest.raises(ddstore.Error) as e:
        read_plan([fake_binary(tmp_path, status, stderr), *ARGS], 0, False)
    assert type(e.value) is cls
    assert stderr in str(e.value)  # passed on for the reader


def test_read_plan_usage_is_an_older_binary(tmp_path):
    # Whatever the binary prints: the usage status says it lacks a flag.
    with pytest.raises(ddstore.InternalError, match="older than this package") as e:
        read_plan([fake_binary(tmp_path, _errors.EXIT_USAGE, "no words about flags"), *ARGS], 0, False)
    assert "no words about flags" in str(e.value)
    with pytest.raises(ddstore.InternalError) as e:
        read_plan([fake_binary(tmp_path, 1, "flag provided but not defined: -emit-rank"), *ARGS], 0, False)
    assert "older than this package" not in str(e.value)


def test_spawn_reads_the_status(tmp_path):
    """spawn is content with the status of an agent that lost the race, and
    fails on any other, whatever the binary wrote."""
    b = fake_binary(tmp_path, _errors.EXIT_AGENT_RUNS, "some text")
    assert _agent.spawn("ns", "n0", str(tmp_path / "s.sock"), binary=b) is None
    b = fake_binary(tmp_path, _errors.EXIT_KIND + 12, "an agent already runs")
    with pytest.raises(ddstore.NoAgent, match="already runs"):
        _agent.spawn("ns", "n0", str(tmp_path / "s.sock"), binary=b)
