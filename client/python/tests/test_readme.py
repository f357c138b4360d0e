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
