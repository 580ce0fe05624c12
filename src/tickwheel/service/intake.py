"""What a submission holds: a request body read into event-log rows, each validated as
the engines would parse it, stamped with the server's time where it has none.

Pure: bytes in, lines out (or the reasons each row is refused). The server decides
what to answer and the journal decides where the lines go.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from tickwheel.pipeline.events import MAX_ROW_CHARS, Reason, parse_wire

__all__ = [
    "MAX_BODY_BYTES",
    "MAX_ROWS_PER_REQUEST",
    "IntakeError",
    "RefusedRow",
    "TimeStamper",
    "read_rows",
]

#: The largest request body taken; a larger one is answered 413 unread.
MAX_BODY_BYTES: Final = 8 << 20
#: The most rows in one request: a larger batch is refused whole (split it).
MAX_ROWS_PER_REQUEST: Final = 100_000
_SHOWN_CHARS: Final = 200


@dataclass(frozen=True, slots=True)
class RefusedRow:
    """One row of a request that no engine would apply, and why (a quarantine reason,
    as the engines name it)."""

    index: int
    reason: str
    row: str


class IntakeError(ValueError):
    """A request that is refused whole: nothing of it is written."""

    def __init__(self, message: str, refused: tuple[RefusedRow, ...] = ()) -> None:
        super().__init__(message)
        self.refused = refused

    def as_json(self) -> dict[str, Any]:
        return {"error": str(self), "refused": [
            {"index": r.index, "reason": r.reason, "row": r.row} for r in self.refused]}


class TimeStamper:
    """The server's time for rows that carry none: the wall clock, but never below a
    time already handed out, so that a stamped row is never behind an earlier one
    (the engines count a row that far behind as late)."""

    def __init__(self, clock: Callable[[], int]) -> None:
        self._clock = clock
        self._last = 0
        self._lock = threading.Lock()

    def stamp(self) -> int:
        with self._lock:
            self._last = max(self._last, self._clock())
            return self._last

    @property
    def last_ms(self) -> int:
        return self._last


class _Repeated(dict[str, Any]):
    """An object that names a field twice: the engines quarantine it
    (``duplicate_field``), so it is marked here rather than silently kept last."""


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    row = dict(pairs)
    return _Repeated(row) if len(row) != len(pairs) else row


def _repeats(value: Any) -> bool:
    if isinstance(value, _Repeated):
        return True
    if isinstance(value, dict):
        return any(_repeats(v) for v in value.values())
    if isinstance(value, list):
        return any(_repeats(v) for v in value)
    return False


def _loads(text: str) -> Any:
    return json.loads(text, object_pairs_hook=_pairs)


def _objects(body: bytes) -> list[Any]:
    """A JSON object, a JSON array of them, or JSON Lines."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise IntakeError(f"the body is not UTF-8 (byte {exc.start})") from None
    stripped = text.strip()
    if not stripped:
        raise IntakeError("the body holds no rows")
    if stripped[0] == "[":
        try:
            rows = _loads(stripped)
        except ValueError as exc:
            raise IntakeError(f"the body is not a JSON array: {exc}") from None
        if not isinstance(rows, list):  # pragma: no cover - '[' opens an array
            raise IntakeError("the body is not a JSON array")
        return rows
    lines = [line for line in stripped.splitlines() if line.strip()]
    out: list[Any] = []
    refused: list[RefusedRow] = []
    for index, line in enumerate(lines):
        try:
            out.append(_loads(line))
        except ValueError:
            refused.append(RefusedRow(index, Reason.UNPARSEABLE.value, line[:_SHOWN_CHARS]))
            out.append(None)
    if refused:
        raise IntakeError(f"{len(refused)} of {len(lines)} rows are not JSON", tuple(refused))
    return out


def read_rows(body: bytes, now_ms: int, *, max_ts_ms: int | None = None) -> list[str]:
    """The rows of ``body`` as event-log lines, each with ``ts_ms`` (``now_ms`` where a
    row has none); :class:`IntakeError` naming every row an engine would quarantine
    (and ``future`` past ``max_ts_ms``), in which case none is taken."""
    rows = _objects(body)
    if len(rows) > MAX_ROWS_PER_REQUEST:
        raise IntakeError(f"{len(rows):,} rows in one request: at most "
                          f"{MAX_ROWS_PER_REQUEST:,}, split it")
    lines: list[str] = []
    refused: list[RefusedRow] = []
    for index, row in enumerate(rows):
        if not isinstance(row, dict):
            refused.append(RefusedRow(index, Reason.UNPARSEABLE.value,
                                      json.dumps(row)[:_SHOWN_CHARS]))
            continue
        if _repeats(row):
            refused.append(RefusedRow(index, Reason.DUPLICATE_FIELD.value,
                                      json.dumps(row)[:_SHOWN_CHARS]))
            continue
        stamped = row if "ts_ms" in row else {"ts_ms": now_ms, **row}
        line = json.dumps(stamped, separators=(",", ":"), ensure_ascii=False)
        reason = _problem(line, max_ts_ms)
        if reason is not None:
            refused.append(RefusedRow(index, reason, line[:_SHOWN_CHARS]))
            continue
        lines.append(line)
    if refused:
        raise IntakeError(f"{len(refused)} of {len(rows)} rows refused", tuple(refused))
    return lines


def _problem(line: str, max_ts_ms: int | None) -> str | None:
    if len(line) > MAX_ROW_CHARS:
        return Reason.TOO_LONG.value
    fields = parse_wire(line)
    if len(fields) == 3:  # the quarantined form: (raw, reason, ts_ms)
        return str(fields[1])
    if max_ts_ms is not None and fields[0] > max_ts_ms:
        return Reason.FUTURE.value
    return None
