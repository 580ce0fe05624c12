"""The README's quick start runs as written and prints what it says; the service's
example runs against a service in tests/test_docs_examples.py, with every other example
of the docs."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


def blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), re.S)


def test_quick_start_runs(capsys: pytest.CaptureFixture[str]) -> None:
    exec(compile(blocks()[0], "README.md", "exec"), {})
    lines = capsys.readouterr().out.splitlines()
    assert lines == ["heartbeat"] * 4 + ["heartbeat", "it is 5 s"] or lines == [
        "heartbeat"] * 4 + ["it is 5 s", "heartbeat"]


def test_purgatory_example_runs(capsys: pytest.CaptureFixture[str]) -> None:
    example = next(b for b in blocks() if "Purgatory(" in b)
    exec(compile(example, "README.md", "exec"), {})
    assert capsys.readouterr().out.splitlines() == ["done"]


def test_dispatcher_example_runs(capsys: pytest.CaptureFixture[str]) -> None:
    example = next(b for b in blocks() if "create_batching_dispatcher" in b)
    exec(compile(example, "README.md", "exec"), {})
    lines = capsys.readouterr().out.splitlines()
    delivered = sum(int(line.split()[1]) for line in lines)
    assert 600 <= delivered <= 1_000  # duplicates of a pending id override it


def test_asyncio_example_runs() -> None:
    example = next(b for b in blocks() if "tickwheel.aio" in b)
    exec(compile(example, "README.md", "exec"), {})
