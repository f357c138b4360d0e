"""Runs examples/two_agents.py against the test cluster, as a user would."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from .conftest import Cluster

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "two_agents.py"


def test_two_agents_example(cluster: Cluster, namespace: str) -> None:
    env = {**os.environ, "BATON_ENDPOINTS": ",".join(cluster.endpoints),
           "BATON_NAMESPACE": namespace}
    done = subprocess.run([sys.executable, str(EXAMPLE)], env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert "tool result: denied: agent-" in out and " holds src/auth.rs for " in out
    assert "late write refused: STALE_FENCE" in out
    assert "guard reports: expired" in out
    lines = out.splitlines()
    winner = next(l.split(":")[0] for l in lines if " holds src/auth.rs with fence " in l)
    loser = "agent-b" if winner == "agent-a" else "agent-a"
    assert f"{loser}: tool result: {loser} wrote src/auth.rs" in out
    assert lines[-1] == f"final value of files/src/auth.rs: \"{loser}'s version\""
