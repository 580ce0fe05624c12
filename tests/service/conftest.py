"""What the service's tests share: the rows an API landed, and a service's address as
it prints it."""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from tickwheel.service.server import SubmitServer


def landed_rows(input_dir: Path) -> list[dict[str, object]]:
    """Every row the submit API landed in ``input_dir``, in the order it landed them
    (lines end at ``\n`` alone, as the engines end them: a row may hold U+2028)."""
    return [json.loads(line) for path in sorted(input_dir.glob("submit-*.jsonl"))
            for line in path.read_text().split("\n") if line]


def service_url(child: subprocess.Popen[str]) -> str:
    """The API's address a starting service prints, read up to its "following" line."""
    assert child.stdout is not None
    url = ""
    for line in child.stdout:
        found = re.search(r"taking rows at (http://\S+)/v1/events", line)
        url = found.group(1) if found else url
        if line.startswith("following"):
            break
    assert url, "the service printed no address"
    return url


@pytest.fixture
def server(tmp_path: Path) -> Iterator[SubmitServer]:
    """A submit API alone (no engine) whose clock reads 5,000 ms."""
    pytest.importorskip("aiohttp")
    from tickwheel.service.server import SubmitServer

    with SubmitServer(tmp_path / "in", tmp_path / "state", clock=lambda: 5_000) as running:
        yield running


class FakeEngine:
    """What a submit server asks of its engine, set by a test: the rows read, the
    input files committed, and the counts (a ``FollowingEngine`` with no batches)."""

    def __init__(self, input_dir: Path, *, pending: int = 0) -> None:
        from tickwheel.pipeline.engines.following import FollowCounts

        self.input_dir = self.output_dir = self.checkpoint_dir = input_dir
        self.lateness_ms = 0
        self.dedupe_retention_ms: int | None = None
        self.clock = None
        self.rows_read = 0
        self.committed: set[str] = set()
        self._counts = FollowCounts(pending=pending)

    def counts(self) -> object:
        return self._counts

    def committed_inputs(self, names: Iterable[str]) -> list[str]:
        return [name for name in names if name in self.committed]

    def follow(self, *args: object, **kwargs: object) -> object:
        raise NotImplementedError("a fake engine runs no batch")
