"""The README's quick start runs as written."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


def test_quick_start_runs(capsys: pytest.CaptureFixture[str]) -> None:
    block = re.search(r"```python\n(.*?)```", README.read_text(), re.S)
    assert block is not None
    exec(compile(block.group(1), "README.md", "exec"), {})
    lines = capsys.readouterr().out.splitlines()
    assert lines == ["heartbeat"] * 4 + ["heartbeat", "it is 5 s"] or lines == [
        "heartbeat"] * 4 + ["it is 5 s", "heartbeat"]
