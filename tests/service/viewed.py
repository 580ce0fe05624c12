"""A local engine on a manual clock that keeps a read view up to date, and the rows the
read API's tests feed it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tickwheel.pipeline.engines.follow import LocalFollowEngine
from tickwheel.service.view import StateView


class Clock:
    def __init__(self, ms: int) -> None:
        self.ms = ms

    def __call__(self) -> int:
        return self.ms


def land(directory: Path, name: str, rows: list[dict[str, Any]]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / f".{name}.tmp"
    tmp.write_text("".join(json.dumps(row) + "\n" for row in rows))
    tmp.rename(directory / name)


def schedule(ts: int, schedule_id: str, **spec: Any) -> dict[str, Any]:
    return {"ts_ms": ts, "type": "schedule", "schedule_id": schedule_id, **spec}


def row(ts: int, kind: str, schedule_id: str) -> dict[str, Any]:
    return {"ts_ms": ts, "type": kind, "schedule_id": schedule_id}


def watch(ts: int, op_id: str, deadline: int, keys: list[str] | None = None) -> dict[str, Any]:
    return {"ts_ms": ts, "type": "watch", "op_id": op_id, "keys": keys or ["k"],
            "deadline_ms": deadline, "condition": "any_update"}


class Service:
    """A local engine on a manual clock, with a view it keeps up to date."""

    def __init__(self, tmp_path: Path, **options: Any) -> None:
        self.inbox = tmp_path / "in"
        self.inbox.mkdir(exist_ok=True)
        self.clock = Clock(options.pop("clock_ms", 1_000))
        self.view = StateView()
        self.engine = LocalFollowEngine(self.inbox, tmp_path / "out", clock=self.clock,
                                        lateness_ms=100, on_commit=self.view.apply,
                                        **options)
        self.files = 0

    def feed(self, rows: list[dict[str, Any]], until_ms: int) -> None:
        if rows:
            self.files += 1
            land(self.inbox, f"rows-{self.files:05d}.jsonl", rows)
        self.clock.ms = until_ms
        self.engine.step()

    def close(self) -> None:
        self.engine.close()
