"""The README's Python examples run, in order, against the test cluster (the admin example,
which needs an admin token, is covered by test_errors.py instead)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from .conftest import Cluster

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_examples_run(cluster: Cluster, namespace: str, tmp_path: Path,
                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BATON_ENDPOINTS", ",".join(cluster.endpoints))
    monkeypatch.setenv("BATON_NAMESPACE", namespace)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "src").mkdir()
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    assert len(blocks) >= 10
    scope: dict[str, Any] = {}
    ran = 0
    for number, block in enumerate(blocks):
        if "baton_..." in block:
            continue
        code = block.replace('["http://127.0.0.1:7420"]', "None")
        exec(compile(code, f"README.md python block {number}", "exec"), scope)
        ran += 1
    assert ran == len(blocks) - 1


REPOSITORY_README = Path(__file__).resolve().parents[3] / "README.md"


def test_the_repository_readme_python_example_runs(
    cluster: Cluster, namespace: str, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch
) -> None:
    """The root README's Python block, as written but for the endpoint: the tool runs when the
    path is free, and returns agent-b's denial as its result when agent-b holds it."""
    monkeypatch.setenv("BATON_NAMESPACE", namespace)
    blocks = re.findall(r"```python\n(.*?)```", REPOSITORY_README.read_text(), re.S)
    assert len(blocks) == 1
    code = blocks[0].replace('["http://127.0.0.1:7420"]', repr(cluster.endpoints))
    assert code != blocks[0]
    exec(compile(code, "README.md python block", "exec"), {})
    printed = capsys.readouterr().out.splitlines()
    assert printed[0] == "edited src/auth.rs"
    assert printed[1].startswith("denied: agent-b holds src/auth.rs for "), printed
    assert printed[1].endswith(" s more"), printed
