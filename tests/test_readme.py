"""The README's quick start runs as written."""

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


def test_service_client_example_runs(tmp_path: Path) -> None:
    pytest.importorskip("aiohttp")
    import json

    from tickwheel.service.server import SubmitServer

    example = next(b for b in blocks() if "tickwheel.client" in b)
    with SubmitServer(tmp_path / "in", tmp_path / "state") as server:
        exec(compile(example.replace("http://127.0.0.1:8470", server.url), "README.md",
                     "exec"), {})
    rows = [json.loads(line) for path in sorted((tmp_path / "in").glob("submit-*"))
            for line in path.read_text().splitlines()]
    assert [r["type"] for r in rows] == ["watch", "cancel", "schedule"]
