"""What a submission holds: a request body read into event-log rows, each validated as
the engines would parse it, stamped with the server's time where it has none.

Pure: bytes in, lines out (or the reasons each row is refused). The server decides
what to answer and the journal decides where the lines go.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Final

from tickwheel.pipeline.contract.events import (
    MAX_ROW_CHARS,
    Q_REASON,
    T_PAUSE,
    T_RESUME,
    T_SCHEDULE,
    T_UNSCHEDULE,
    W_TARGET,
    W_TS,
    Reason,
    Wire,
    compact_wire,
    holds,
    is_quarantined,
    is_utf8,
)
from tickwheel.service.api import RefusedRow

__all__ = [
    "MAX_BODY_BYTES",
    "MAX_ROWS_PER_REQUEST",
    "SCHEDULE_ACTIONS",
    "IntakeError",
    "ParsedRows",
    "read_parsed_rows",
    "schedule_row",
]

#: The largest request body taken; a larger one is answered 413 unread.
MAX_BODY_BYTES: Final = 8 << 20
#: The most rows in one request: a larger batch is refused whole (split it).
MAX_ROWS_PER_REQUEST: Final = 100_000
_SHOWN_CHARS: Final = 200


class IntakeError(ValueError):
    """A request that is refused whole: nothing of it is written."""

    def __init__(self, message: str, refused: tuple[RefusedRow, ...] = ()) -> None:
        super().__init__(message)
        self.refused = refused

    def as_json(self) -> dict[str, Any]:
        return {"error": str(self), "refused": [
            {"index": r.index, "reason": r.reason, "row": r.row} for r in self.refused]}


class _Repeated(dict[str, Any]):
    """An object that names a field twice: the engines quarantine it
    (``duplicate_field``), so it is marked here rather than silently kept last."""


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    row = dict(pairs)
    return _Repeated(row) if len(row) != len(pairs) else row


def _repeats(value: Any) -> bool:
    return holds(value, lambda item: isinstance(item, _Repeated))


def _dumps(row: Any) -> str:
    """``row`` as one line of JSON: its characters as they are, or escaped where a
    string holds a lone surrogate (valid JSON, but no UTF-8 file can hold it raw)."""
    line = json.dumps(row, separators=(",", ":"), ensure_ascii=False)
    return line if is_utf8(line) else json.dumps(row, separators=(",", ":"))


def _shown(row: Any) -> str:
    try:
        return json.dumps(row)[:_SHOWN_CHARS]
    except RecursionError:
        return "(nested too deep to show)"


def _loads(text: str) -> Any:
    return json.loads(text, object_pairs_hook=_pairs)


def _text(body: bytes) -> str:
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise IntakeError(f"the body is not UTF-8 (byte {exc.start})") from None
    stripped = text.removeprefix("\ufeff").strip()  # a byte order mark, as the engines
    if not stripped:
        raise IntakeError("the body holds no rows")
    return stripped


def _array_lines(text: str, now_ms: int) -> list[str | RefusedRow]:
    """A JSON array's rows as lines, each stamped where it has no ``ts_ms``."""
    try:
        rows = _loads(text)
    except ValueError as exc:
        raise IntakeError(f"the body is not a JSON array: {exc}") from None
    except RecursionError:  # nested deeper than the parser goes
        raise IntakeError("the body is not a JSON array of rows: nested too deep") from None
    if not isinstance(rows, list):
        raise IntakeError("the body is not a JSON array of rows")
    if not rows:
        raise IntakeError("the body holds no rows")
    out: list[str | RefusedRow] = []
    for index, row in enumerate(rows):
        if not isinstance(row, dict):
            out.append(RefusedRow(index, Reason.UNPARSEABLE.value, _shown(row)))
        elif _repeats(row):
            out.append(RefusedRow(index, Reason.DUPLICATE_FIELD.value, _shown(row)))
        else:
            stamped = row if "ts_ms" in row else {"ts_ms": now_ms, **row}
            try:
                out.append(_dumps(stamped))
            except RecursionError:
                out.append(RefusedRow(index, Reason.UNPARSEABLE.value, _shown(row)))
    return out


def _stamped(line: str, now_ms: int) -> tuple[str, Wire]:
    """``line`` with ``"ts_ms": now_ms`` first in its object if it has none, and its
    fields as the engines parse it: the raw text kept (no parse and dump), and parsed
    once where it names ``ts_ms`` or lacks it plainly."""
    if '"ts_ms"' in line:  # most likely its own: then no stamp is needed
        fields = compact_wire(line)
        if not is_quarantined(fields):
            return line, fields
    if not line.startswith("{"):
        return line, compact_wire(line)
    rest = line[1:].lstrip()
    stamped = (f'{{"ts_ms":{now_ms}}}' if rest.startswith("}")
               else f'{{"ts_ms":{now_ms},{line[1:]}')
    fields = compact_wire(stamped)
    if is_quarantined(fields) and fields[Q_REASON] == Reason.DUPLICATE_FIELD.value:
        return line, compact_wire(line)  # its own ts_ms, spelt otherwise, or a repeat
    return stamped, fields


#: The management requests on one schedule, by the row each writes.
SCHEDULE_ACTIONS: Final = (T_SCHEDULE, T_PAUSE, T_RESUME, T_UNSCHEDULE)


def schedule_row(kind: str, schedule_id: str, body: bytes) -> bytes:
    """The row that a management request on ``schedule_id`` writes, as a body for
    :func:`read_parsed_rows`: for ``schedule``, ``body`` is a JSON object of the
    schedule's fields; for the others it is empty (or an empty object).
    :class:`IntakeError` for a body that is not that."""
    if kind not in SCHEDULE_ACTIONS:
        raise ValueError(f"kind must be one of {SCHEDULE_ACTIONS}, not {kind!r}")
    text = body.decode("utf-8", "replace").strip() if body else ""
    if kind != T_SCHEDULE:
        if text not in ("", "{}"):
            raise IntakeError(f"a {kind} request takes no body")
        fields: dict[str, Any] = {}
    else:
        try:
            fields = _loads(_text(body))
        except ValueError as exc:
            raise IntakeError(f"the body is not a JSON object of the schedule's fields: "
                              f"{exc}") from None
        except RecursionError:
            raise IntakeError("the body is nested too deep") from None
        if not isinstance(fields, dict) or not fields:
            raise IntakeError("the body must be a JSON object of the schedule's fields, "
                              "such as {\"cron\": \"0 * * * *\", \"tz\": \"UTC\"}")
        if _repeats(fields):
            raise IntakeError("the body names a field twice", (
                RefusedRow(0, Reason.DUPLICATE_FIELD.value, _shown(fields)),))
        for name, wanted in (("type", kind), ("schedule_id", schedule_id)):
            if name in fields and fields[name] != wanted:
                raise IntakeError(f"the body's {name} is not the request's ({wanted!r})")
    row = {**fields, "type": kind, "schedule_id": schedule_id}
    try:
        return _dumps(row).encode("utf-8")
    except RecursionError:
        raise IntakeError("the body is nested too deep") from None


@dataclass(frozen=True, slots=True)
class ParsedRows:
    """A request's rows as event-log lines, and each in the wire form the engines parse
    it into (:func:`~tickwheel.pipeline.contract.events.compact_wire`)."""

    lines: list[str]
    rows: list[Wire]


def read_parsed_rows(body: bytes, now_ms: int, *, max_ts_ms: int | None = None,
                     targets: frozenset[str] | None = None) -> ParsedRows:
    """The rows of ``body`` (one JSON object, a JSON array of them, or JSON Lines) as
    event-log lines, each with ``ts_ms`` (``now_ms`` where a row has none), and in
    their wire form; :class:`IntakeError` naming every row an engine would quarantine
    (and ``future`` past ``max_ts_ms``, and ``unknown_target`` for a row naming a
    target not in ``targets``), in which case none is taken."""
    text = _text(body)
    candidates: list[str | RefusedRow] | None = None
    if text.startswith("["):
        candidates = _array_lines(text, now_ms)
        shown: list[str] = [c if isinstance(c, str) else "" for c in candidates]
    else:
        # Lines end as the engines end them (not at str.splitlines' other breaks,
        # which a JSON string may hold).
        ends = text.replace("\r\n", "\n").replace("\r", "\n") if "\r" in text else text
        shown = [line.strip() for line in ends.split("\n") if line.strip()]
    if len(shown) > MAX_ROWS_PER_REQUEST:  # before a row of JSON Lines is parsed
        raise IntakeError(f"{len(shown):,} rows in one request: at most "
                          f"{MAX_ROWS_PER_REQUEST:,}, split it")
    checked: list[tuple[str, Wire] | RefusedRow] = (
        [_stamped(line, now_ms) for line in shown] if candidates is None
        else [c if isinstance(c, RefusedRow) else (c, compact_wire(c)) for c in candidates])
    lines: list[str] = []
    rows: list[Wire] = []
    refused: list[RefusedRow] = []
    for index, candidate in enumerate(checked):
        if isinstance(candidate, RefusedRow):
            refused.append(candidate)
            continue
        line, fields = candidate
        reason = _problem(line, fields, max_ts_ms, targets)
        if reason is not None:
            refused.append(RefusedRow(index, reason, shown[index][:_SHOWN_CHARS]))
            continue
        lines.append(line)
        rows.append(fields)
    if refused:
        raise IntakeError(f"{len(refused)} of {len(checked)} rows refused", tuple(refused))
    return ParsedRows(lines, rows)


def _problem(line: str, fields: Wire, max_ts_ms: int | None,
             targets: frozenset[str] | None) -> str | None:
    if len(line) > MAX_ROW_CHARS:
        return Reason.TOO_LONG.value
    if is_quarantined(fields):
        return str(fields[Q_REASON])
    if max_ts_ms is not None and fields[W_TS] > max_ts_ms:
        return Reason.FUTURE.value
    target: str | None = fields[W_TARGET]
    if targets is not None and target is not None and target not in targets:
        return Reason.UNKNOWN_TARGET.value
    return None
