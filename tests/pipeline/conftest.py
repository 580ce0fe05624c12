"""One Spark session for every Spark test of the run: starting one takes seconds; and
the seen log's chunks a test sees applied."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    from tickwheel.pipeline.spark import spark_session

    session = spark_session("local[2]", app_name="tickwheel-tests", driver_memory="2g")
    yield session
    session.stop()


@pytest.fixture
def applied_seen_chunks(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """Every segment of a seen log decoded and applied from now on, in order (its ids'
    bytes)."""
    from tickwheel.pipeline.state.seen_log import SeenLog, SeenSegment

    applied: list[bytes] = []
    apply = SeenLog._apply

    def counted(self: SeenLog, number: int, segment: SeenSegment) -> None:
        applied.append(segment[0])
        apply(self, number, segment)

    monkeypatch.setattr(SeenLog, "_apply", counted)
    return applied
