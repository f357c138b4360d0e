"""A process that forks or exits while a guard runs does not hang, and a forked child never
releases (or renews) its parent's lease."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

from .conftest import Cluster

SCRIPT = textwrap.dedent(
    """
    import os, sys, time
    import baton

    client = baton.Client(sys.argv[1].split(","), namespace=sys.argv[2], holder="forker",
                          timeout=2.0)
    guard = client.lease("fork/x", ttl=2.0).acquire()
    pid = os.fork()
    if pid == 0:
        # The child: its copy of the guard is not renewed here and never releases.
        guard.release()
        print("child-valid", guard.is_valid(), flush=True)
        sys.exit(0)  # a normal exit, atexit and all: must not hang
    _, status = os.waitpid(pid, 0)
    print("child-status", status, flush=True)
    time.sleep(2.5)  # past the TTL: the parent's thread kept renewing
    print("parent-valid", guard.is_valid(), flush=True)
    print("held-fence", client.get_lease("fork/x")["fence"] == guard.fence, flush=True)
    # Exit with the guard still held and its thread running.
    """
)


def test_fork_and_exit_with_a_running_guard(cluster: Cluster, namespace: str) -> None:
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, ",".join(cluster.endpoints), namespace],
        capture_output=True, text=True, timeout=30,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.split("\n")
    assert "child-valid True" in lines
    assert "child-status 0" in lines
    assert "parent-valid True" in lines
    assert "held-fence True" in lines
    assert time.monotonic() - started < 15
