"""The event log: the contract between the generator, both engines and users.

One event per row (JSON Lines here; Parquet uses the same column names). Every row
either parses into an :class:`Event` or becomes a :class:`Quarantined` row with the raw
text, a short reason code and its ``ts_ms`` when known. Values of the wrong JSON type
are quarantined, never coerced (a float is not a long, a bool is not a number).
"""

from __future__ import annotations

import enum
import importlib
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final, NamedTuple, TypeGuard

from tickwheel.schedules import Schedule, ScheduleError


def _orjson_loads() -> Callable[[str], Any] | None:
    """orjson's ``loads`` if installed (the spark and cli extras; json decodes the same
    rows). Imported by name, so that the core compiles where orjson is absent."""
    try:
        module = importlib.import_module("orjson")
    except ImportError:
        return None
    loads: Callable[[str], Any] = module.loads
    return loads


_fast_loads = _orjson_loads()

__all__ = [
    "MAX_PAYLOAD_BYTES",
    "MAX_ROW_CHARS",
    "Q_RAW",
    "Q_REASON",
    "Q_TS",
    "SCHEDULE_FIELDS",
    "TARGET_NAME",
    "TOO_LONG_KEPT_CHARS",
    "T_CANCEL",
    "T_PAUSE",
    "T_RESUME",
    "T_SCHEDULE",
    "T_TICK",
    "T_UNSCHEDULE",
    "T_UPDATE",
    "T_WATCH",
    "W_CONDITION",
    "W_DEADLINE",
    "W_ERROR",
    "W_KEY",
    "W_KEYS",
    "W_MIN_TOTAL",
    "W_OP_ID",
    "W_PAYLOAD",
    "W_RAW",
    "W_TARGET",
    "W_TARGETS",
    "W_TS",
    "W_TYPE",
    "W_VALUE",
    "Condition",
    "Event",
    "EventType",
    "OutcomeKind",
    "Quarantined",
    "Reason",
    "Wire",
    "canonical_line",
    "compact_wire",
    "event_from_wire",
    "from_wire",
    "holds",
    "is_quarantined",
    "is_utf8",
    "line_of",
    "new_event",
    "parse_line",
    "parse_row",
    "parse_wire",
    "to_wire",
    "wire_line",
]


class EventType(enum.Enum):
    WATCH = "watch"
    UPDATE = "update"
    CANCEL = "cancel"
    TICK = "tick"
    # Recurring schedules, by ``schedule_id`` (held in ``op_id``; a ``schedule`` row's
    # spec in ``targets``).
    SCHEDULE = "schedule"
    UNSCHEDULE = "unschedule"
    PAUSE = "pause"
    RESUME = "resume"


#: Each row type as the wire form holds it (``fields[W_TYPE]``), each its
#: :class:`EventType`'s value: the kind tests name these, which mypyc inlines.
T_WATCH: Final = "watch"
T_UPDATE: Final = "update"
T_CANCEL: Final = "cancel"
T_TICK: Final = "tick"
T_SCHEDULE: Final = "schedule"
T_UNSCHEDULE: Final = "unschedule"
T_PAUSE: Final = "pause"
T_RESUME: Final = "resume"


class Condition(enum.Enum):
    ALL_AT_LEAST = "all_at_least"  # every key's value reached its target (acks=all)
    SUM_AT_LEAST = "sum_at_least"  # sum of (value - start) over keys >= min_total (fetch)
    ANY_UPDATE = "any_update"  # any update of a key after registration (a heartbeat)
    NONE = "none"  # expiry or cancel only ("do X at time T")


class Reason(enum.Enum):
    UNPARSEABLE = "unparseable"
    MISSING_FIELD = "missing_field"
    BAD_TYPE = "bad_type"
    UNKNOWN_TYPE = "unknown_type"
    UNKNOWN_CONDITION = "unknown_condition"
    BAD_KEYS = "bad_keys"
    BAD_TARGETS = "bad_targets"
    VALUE_AND_ERROR = "value_and_error"
    DUPLICATE_OP_ID = "duplicate_op_id"
    LATE = "late"
    # deadline_ms - ts_ms does not fit a long: the outcome's latency_ms could not be
    # written (the outputs' columns are int64), and the run would fail on it.
    BAD_DEADLINE = "bad_deadline"
    # A string with a lone surrogate ("\ud800" is valid JSON): no UTF-8 output can
    # hold it, and it would fail the whole run where the outcome is written.
    BAD_STRING = "bad_string"
    # An object that names a field twice: JSON leaves its meaning to the reader (json
    # and orjson keep the last value, other readers the first or neither).
    DUPLICATE_FIELD = "duplicate_field"
    # A row longer than MAX_ROW_CHARS, not parsed.
    TOO_LONG = "too_long"
    # A schedule row whose spec is malformed or can never fire.
    BAD_SCHEDULE = "bad_schedule"
    # Follow mode on the wall clock: ts_ms further ahead of the clock than the bound.
    # Taken, it would move time so far that everything pending expired at once.
    FUTURE = "future"
    # A schedule_id that is empty or holds "@": an occurrence's id,
    # <schedule_id>@<occurrence ms>, would not say which schedule it is of.
    BAD_ID = "bad_id"
    # A payload whose JSON text is longer than MAX_PAYLOAD_BYTES.
    PAYLOAD_TOO_LARGE = "payload_too_large"
    # A target that is not a name (TARGET_NAME): it names a directory of dead letters.
    BAD_TARGET = "bad_target"
    # A target that the service's targets file does not define (the submit API's
    # answer; a log's rows keep any well-formed name).
    UNKNOWN_TARGET = "unknown_target"


#: A ``schedule`` row's spec fields (those of :class:`~tickwheel.Schedule`), in the
#: contract's order.
SCHEDULE_FIELDS: Final = ("every_ms", "anchor_ms", "cron", "tz", "start_ms", "end_ms",
                          "max_runs", "jitter_ms", "misfire", "grace_ms", "catchup_ms")
#: The row types that name a schedule by its ``schedule_id``.
_SCHEDULE_TYPES: Final = frozenset({T_SCHEDULE, T_UNSCHEDULE, T_PAUSE, T_RESUME})

#: The longest row read, in characters. A longer one is quarantined as ``too_long``
#: unparsed, keeping its first TOO_LONG_KEPT_CHARS: one huge row would otherwise be
#: held whole in memory, in state and in the shuffle, and a Parquet string column
#: cannot hold one of 2 GiB. Kafka bounds a record (``message.max.bytes``, 1 MiB) and
#: Vector's file source a line (``max_line_bytes``) for the same reasons.
MAX_ROW_CHARS: Final = 1 << 20
TOO_LONG_KEPT_CHARS: Final = 1024
#: The largest ``payload`` a ``watch`` or ``schedule`` row carries, in bytes of its
#: compact JSON text (UTF-8). It is held once per operation or schedule and copied
#: into every outcome, so it is bounded well below a row.
MAX_PAYLOAD_BYTES: Final = 64 * 1024
#: What a ``target`` may be: a name that is also a safe directory name (a target's
#: dead letters are kept under it).
TARGET_NAME: Final = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}")


class OutcomeKind(enum.Enum):
    """How an operation of the event log was resolved: the ``outcome`` column. The
    purgatory's own :class:`tickwheel.Outcome` says the same of a ``DelayedOperation``."""

    COMPLETED = "completed"
    EXPIRED = "expired"
    CANCELLED = "cancelled"
    ERROR = "error"
    FIRED = "fired"  # an occurrence of a recurring schedule


class Event(NamedTuple):
    """A well-formed row. A tuple: cheap to build and to pickle, which the Spark
    engine does for every row it moves between processes."""

    ts_ms: int
    type: EventType
    raw: str | None  # None: the row is its canonical_line() (see compact_wire)
    op_id: str | None = None  # a schedule row's schedule_id
    keys: tuple[str, ...] = ()
    deadline_ms: int = 0
    condition: Condition | None = None
    # Read-only, so one shared empty default is safe. A ``schedule`` row's spec fields.
    targets: Mapping[str, int] = {}
    min_total: int = 0
    key: str | None = None
    value: int | None = None
    error: str | None = None
    # A watch's or schedule's delivery target (a name) and payload (compact JSON
    # text), carried into every outcome of it.
    target: str | None = None
    payload: str | None = None


_EMPTY: Mapping[str, int] = {}


def new_event(ts_ms: int, type: EventType, raw: str | None, op_id: str | None = None,
              keys: tuple[str, ...] = (), deadline_ms: int = 0,
              condition: Condition | None = None, targets: Mapping[str, int] = _EMPTY,
              min_total: int = 0, key: str | None = None, value: int | None = None,
              error: str | None = None, target: str | None = None,
              payload: str | None = None) -> Event:
    """``Event(...)`` without the named tuple's ``__new__``, which is a Python function
    even in the compiled core: this is on the engines' hot paths, once a row."""
    return tuple.__new__(Event, (ts_ms, type, raw, op_id, keys, deadline_ms, condition,
                                 targets, min_total, key, value, error, target, payload))


@dataclass(frozen=True, slots=True)
class Quarantined:
    raw: str
    reason: Reason
    ts_ms: int | None


class _Bad(Exception):
    def __init__(self, reason: Reason, ts_ms: int | None) -> None:
        super().__init__(reason.value)
        self.reason = reason
        self.ts_ms = ts_ms


_LONG_MIN: Final = -9223372036854775808  # -(2**63)
_LONG_MAX: Final = 9223372036854775807  # 2**63 - 1
# The compiled core keeps ints within +-(2**62 - 1) unboxed, and compares those
# natively; a comparison with the 64-bit bounds goes through Python's generic one.
_SMALL: Final = 4611686018427387903  # 2**62 - 1

# By value, as dicts: calling the enum class goes through EnumMeta.__call__ in Python,
# a microsecond a row.
_EVENT_TYPES: dict[str, EventType] = {t.value: t for t in EventType}
_CONDITIONS: dict[str, Condition] = {c.value: c for c in Condition}
_CONDITION_NAMES: dict[str, str] = {c.value: c.value for c in Condition}


def _is_long(value: object) -> TypeGuard[int]:
    # bool is an int subclass, a float is not a long, and JSON integers have no bound
    # while the outputs' columns are 64-bit.
    if type(value) is not int:
        return False
    return -_SMALL <= value <= _SMALL or _LONG_MIN <= value <= _LONG_MAX


def _long(row: dict[str, Any], name: str, ts: int | None) -> int:
    value = row.get(name)
    if value is None:  # absent or null
        raise _Bad(Reason.MISSING_FIELD, ts)
    if not _is_long(value):
        raise _Bad(Reason.BAD_TYPE, ts)
    return value


def is_utf8(text: str) -> bool:
    """True unless ``text`` holds a lone surrogate (an ASCII check is O(1) in CPython)."""
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _string(row: dict[str, Any], name: str, ts: int | None) -> str:
    value = row.get(name)
    if value is None:  # absent or null
        raise _Bad(Reason.MISSING_FIELD, ts)
    if not isinstance(value, str):
        raise _Bad(Reason.BAD_TYPE, ts)
    if not is_utf8(value):
        raise _Bad(Reason.BAD_STRING, ts)
    return value


#: A row as builtins only, for ``marshal`` (several times faster than pickling the
#: named tuple with its enums, and than parsing the raw row again): a well-formed row
#: is ``(ts_ms, type, raw, op_id, keys, deadline_ms, condition, targets, min_total,
#: key, value, error, target, payload)`` with the enums as their values; a quarantined one is
#: ``(raw, reason, ts_ms)``. The Spark engine moves rows in this form and keeps held
#: rows in it, in its checkpoints too. A well-formed row's ``raw`` is None when the
#: row is its :func:`canonical_line` (see :func:`compact_wire`).
Wire = tuple[Any, ...]


#: Where each field sits in a well-formed row's wire form (Final: the compiled core
#: reads them as literals).
W_TS: Final = 0
W_TYPE: Final = 1
W_RAW: Final = 2
W_OP_ID: Final = 3  # a schedule row's schedule_id
W_KEYS: Final = 4
W_DEADLINE: Final = 5
W_CONDITION: Final = 6
W_TARGETS: Final = 7  # a schedule row's spec
W_MIN_TOTAL: Final = 8
W_KEY: Final = 9
W_VALUE: Final = 10
W_ERROR: Final = 11
W_TARGET: Final = 12
W_PAYLOAD: Final = 13
#: ... and in a quarantined row's, ``(raw, reason, ts_ms)``.
Q_RAW: Final = 0
Q_REASON: Final = 1
Q_TS: Final = 2


def is_quarantined(fields: Wire) -> bool:
    """Whether a row in wire form is a quarantined one, ``(raw, reason, ts_ms)``."""
    return len(fields) == 3


_REASONS: dict[str, Reason] = {r.value: r for r in Reason}


def parse_line(line: str) -> Event | Quarantined:
    """One JSON Lines row (not blank: blank lines are not rows)."""
    return from_wire(parse_wire(line))


def parse_row(row: dict[str, Any], raw: str) -> Event | Quarantined:
    """A decoded row; ``raw`` is kept for the quarantine."""
    if len(raw) > MAX_ROW_CHARS:
        return from_wire(_too_long(raw))
    return from_wire(_wire(row, raw))


def parse_wire(line: str) -> Wire:
    """:func:`parse_line`, straight to the wire form: the Spark engine's parsers need
    no :class:`Event` in between."""
    if len(line) > MAX_ROW_CHARS:
        return _too_long(line)
    row = _object(line)
    if row is None:
        return (line, Reason.UNPARSEABLE.value, None)
    refused = _repeated_name(line, row)
    if refused is not None:
        return refused
    return _wire(row, line)


def _too_long(line: str) -> Wire:
    return (line[:TOO_LONG_KEPT_CHARS], Reason.TOO_LONG.value, None)


def _object(line: str) -> dict[str, Any] | None:
    """The JSON object ``line`` holds; None if it holds none."""
    try:
        row = _loads(line)
    except (ValueError, RecursionError):
        return None
    if not isinstance(row, dict):
        return None
    payload = row.get("payload")
    if _fast_loads is not None and payload is not None and _has_float(payload):
        # orjson reads an integer beyond 64 bits as a float: a payload is carried as
        # json reads it, exactly.
        exact: dict[str, Any] = json.loads(line)
        return exact
    return row


def _strings(row: dict[str, Any]) -> int:
    """How many strings a decoded row holds, at every level: names and values."""
    # Two isinstance calls compile to two type checks; one with a tuple of types is a
    # call to PyObject_IsInstance (SIM101 below).
    strings = len(row)
    stack: list[Any] = []
    for value in row.values():
        if isinstance(value, str):
            strings += 1
        elif isinstance(value, dict) or isinstance(value, list):  # noqa: SIM101
            stack.append(value)
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            strings += len(item)
            for value in item.values():
                if isinstance(value, str):
                    strings += 1
                elif isinstance(value, dict) or isinstance(value, list):  # noqa: SIM101
                    stack.append(value)
        elif isinstance(item, list):
            for value in item:
                if isinstance(value, str):
                    strings += 1
                elif isinstance(value, dict) or isinstance(value, list):  # noqa: SIM101
                    stack.append(value)
    return strings


def _repeated_name(line: str, row: dict[str, Any]) -> Wire | None:
    """The quarantine of a row in which some object names a field twice, at any
    level; None when no name is repeated."""
    # Every string of the line, name or value, is written between two quotes, and an
    # escape can add more. Decoding keeps one of a repeated name and drops the value
    # given first, so a line with as many quotes as twice the decoded row's strings
    # repeats no name; a row is read a second time only when it holds an escaped
    # quote or repeats a name.
    if line.count('"') == 2 * _strings(row):
        return None
    objects: list[list[tuple[str, Any]]] = []

    def keep(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        objects.append(pairs)
        return {}

    try:
        json.loads(line, object_pairs_hook=keep)
    except (ValueError, RecursionError):
        return (line, Reason.UNPARSEABLE.value, None)  # as _object would have said
    if all(len({name for name, _ in pairs}) == len(pairs) for pairs in objects):
        return None
    # The outermost object closes last. Its ts_ms is known if it is named once.
    stamps = [value for name, value in objects[-1] if name == "ts_ms"]
    ts = stamps[0] if len(stamps) == 1 and _is_long(stamps[0]) else None
    return (line, Reason.DUPLICATE_FIELD.value, ts)


def compact_wire(line: str) -> Wire:
    """:func:`parse_wire`, without the raw line when :func:`canonical_line` gives it
    back exactly (``raw`` is then None).

    A well-formed row needs its raw line only if it is quarantined later (late, or a
    duplicate op_id), and the raw line was two thirds of a row's wire form: the Spark
    engine moved each row's text through the JVM, its shuffle and its state next to
    the parsed fields. Rows written in the contract's compact form (the generator's,
    and any writer's with ``separators=(",", ":")`` and the contract's field order)
    travel without it; any other line keeps its text, so a quarantined row always
    shows the line as read."""
    if len(line) > MAX_ROW_CHARS:
        return _too_long(line)
    row = _object(line)
    if row is None:
        return (line, Reason.UNPARSEABLE.value, None)
    # Built without the text, and rebuilt with it only where it is needed, so that
    # well-formed rows are not copied.
    fields = _wire(row, None)
    # ASCII without a backslash: no string in the row needed an escape, so no
    # encoder would write it differently (control characters cannot appear unescaped
    # in a line that parsed). A canonical line names each field once.
    if (not is_quarantined(fields) and line.isascii() and "\\" not in line
            and canonical_line(fields) == line):
        return fields
    refused = _repeated_name(line, row)
    if refused is not None:
        return refused
    if is_quarantined(fields):
        return (line, fields[Q_REASON], fields[Q_TS])
    return (fields[W_TS], fields[W_TYPE], line, *fields[W_OP_ID:])


def canonical_line(fields: Wire) -> str:
    """A well-formed row's wire form as compact JSON in the contract's field order:
    ``ts_ms``, ``type``, then ``key`` and ``value`` or ``error`` (update), ``op_id``
    (watch, cancel), ``keys``, ``deadline_ms``, ``condition``, ``targets`` (keyed
    conditions), ``min_total`` (``sum_at_least``), then ``target`` and ``payload``
    (watch, schedule) where the row has them. Strings are written unescaped: it is
    exact only for the rows :func:`compact_wire` checked."""
    ts = fields[W_TS]
    kind = fields[W_TYPE]
    if kind == T_UPDATE:
        key = fields[W_KEY]
        if fields[W_ERROR] is None:
            return f'{{"ts_ms":{ts},"type":"update","key":"{key}","value":{fields[W_VALUE]}}}'
        return f'{{"ts_ms":{ts},"type":"update","key":"{key}","error":"{fields[W_ERROR]}"}}'
    if kind == T_WATCH:
        condition: str = fields[W_CONDITION]
        keys = ",".join([f'"{key}"' for key in fields[W_KEYS]])
        line = (f'{{"ts_ms":{ts},"type":"watch","op_id":"{fields[W_OP_ID]}","keys":[{keys}],'
                f'"deadline_ms":{fields[W_DEADLINE]},"condition":"{condition}"')
        if condition in {"all_at_least", "sum_at_least"}:
            targets = ",".join([f'"{key}":{value}' for key, value in fields[W_TARGETS].items()])
            line += f',"targets":{{{targets}}}'
            if condition == "sum_at_least":
                line += f',"min_total":{fields[W_MIN_TOTAL]}'
        return line + _carried(fields) + "}"
    if kind == T_CANCEL:
        return f'{{"ts_ms":{ts},"type":"cancel","op_id":"{fields[W_OP_ID]}"}}'
    if kind in _SCHEDULE_TYPES:
        line = f'{{"ts_ms":{ts},"type":"{kind}","schedule_id":"{fields[W_OP_ID]}"'
        spec: Mapping[str, Any] = fields[W_TARGETS]
        for name in SCHEDULE_FIELDS:
            value = spec.get(name)
            if value is not None:
                line += f',"{name}":"{value}"' if isinstance(value, str) else f',"{name}":{value}'
        return line + _carried(fields) + "}"
    return f'{{"ts_ms":{ts},"type":"tick"}}'


def _carried(fields: Wire) -> str:
    """The ``target`` and ``payload`` fields of a canonical line, where there are any."""
    target: str | None = fields[W_TARGET]
    payload: str | None = fields[W_PAYLOAD]
    if target is None and payload is None:
        return ""
    text = "" if target is None else f',"target":"{target}"'
    return text if payload is None else f'{text},"payload":{payload}'


def line_of(event: Event) -> str:
    """The row as read: its raw line, or its :func:`canonical_line` when the line was
    left out on the way (:func:`compact_wire`)."""
    if event.raw is not None:
        return event.raw
    return canonical_line(to_wire(event))


def wire_line(fields: Wire) -> str:
    """:func:`line_of` for a well-formed row's wire form."""
    raw: str | None = fields[W_RAW]
    return canonical_line(fields) if raw is None else raw


def _loads(line: str) -> Any:
    """``json.loads(line)``, by orjson when it is installed (2.9 times as fast on
    this project's rows). orjson refuses what json takes beyond RFC 8259 (NaN, lone
    surrogates, 1e400, deep nesting): json decides those. The one value orjson reads
    differently, an integer beyond 64 bits, becomes a float instead of an int, and
    either is a bad type for every field of a row: rows parse the same both ways."""
    if _fast_loads is not None:
        try:
            return _fast_loads(line)
        except ValueError:
            pass
    return json.loads(line)


def to_wire(row: Event | Quarantined) -> Wire:
    # `_value_`: an enum's `.value` is a Python-level descriptor; the member's own
    # attribute is a plain read.
    if isinstance(row, Quarantined):
        return (row.raw, row.reason._value_, row.ts_ms)
    return (row.ts_ms, row.type._value_, row.raw, row.op_id, row.keys, row.deadline_ms,
            None if row.condition is None else row.condition._value_, dict(row.targets),
            row.min_total, row.key, row.value, row.error, row.target, row.payload)


def from_wire(fields: Wire) -> Event | Quarantined:
    if is_quarantined(fields):
        return Quarantined(fields[Q_RAW], _REASONS[fields[Q_REASON]], fields[Q_TS])
    return event_from_wire(fields)


def event_from_wire(fields: Wire) -> Event:
    """The :class:`Event` of a well-formed row's wire form."""
    condition = fields[W_CONDITION]
    return new_event(fields[W_TS], _EVENT_TYPES[fields[W_TYPE]], fields[W_RAW],
                     fields[W_OP_ID], fields[W_KEYS], fields[W_DEADLINE],
                     None if condition is None else _CONDITIONS[condition],
                     fields[W_TARGETS], fields[W_MIN_TOTAL], fields[W_KEY], fields[W_VALUE],
                     fields[W_ERROR], fields[W_TARGET], fields[W_PAYLOAD])


def _wire(row: dict[str, Any], raw: str | None) -> Wire:
    ts: int | None = None
    try:
        ts = _long(row, "ts_ms", None)
        kind = _string(row, "type", ts)
        if kind == T_WATCH:
            return _watch(row, raw, ts)
        if kind == T_UPDATE:
            key = _string(row, "key", ts)
            has_value = row.get("value") is not None
            has_error = row.get("error") is not None
            if has_value and has_error:
                raise _Bad(Reason.VALUE_AND_ERROR, ts)
            if has_value:
                return (ts, T_UPDATE, raw, None, (), 0, None, _EMPTY, 0, key,
                        _long(row, "value", ts), None, None, None)
            if has_error:
                return (ts, T_UPDATE, raw, None, (), 0, None, _EMPTY, 0, key, None,
                        _string(row, "error", ts), None, None)
            raise _Bad(Reason.MISSING_FIELD, ts)
        return _unkeyed(row, raw, ts, kind)
    except _Bad as bad:
        return (raw, bad.reason.value, bad.ts_ms)


def _unkeyed(row: dict[str, Any], raw: str | None, ts: int, kind: str) -> Wire:
    """A row of a type that names no key: a cancel, a tick or a schedule row."""
    if kind == T_CANCEL:
        return (ts, T_CANCEL, raw, _string(row, "op_id", ts), (), 0, None, _EMPTY, 0, None,
                None, None, None, None)
    if kind == T_TICK:
        return (ts, T_TICK, raw, None, (), 0, None, _EMPTY, 0, None, None, None, None, None)
    if kind in _SCHEDULE_TYPES:
        schedule_id = _string(row, "schedule_id", ts)
        if not schedule_id or "@" in schedule_id:
            raise _Bad(Reason.BAD_ID, ts)
        if kind != T_SCHEDULE:
            return (ts, _SCHEDULE_NAMES[kind], raw, schedule_id, (), 0, None, _EMPTY, 0,
                    None, None, None, None, None)
        spec = _schedule_spec(row, ts)
        return (ts, T_SCHEDULE, raw, schedule_id, (), 0, None, spec, 0, None, None, None,
                _target(row, ts), _payload(row, ts))
    raise _Bad(Reason.UNKNOWN_TYPE, ts)


_SCHEDULE_NAMES: dict[str, str] = {name: name for name in _SCHEDULE_TYPES}


def _schedule_spec(row: dict[str, Any], ts: int) -> dict[str, Any]:
    """A ``schedule`` row's spec fields (the ones given, in the contract's order), once
    :class:`~tickwheel.Schedule` took them: malformed, or never firing, is
    ``bad_schedule``. Other fields are ignored, as in every row."""
    spec = {name: row[name] for name in SCHEDULE_FIELDS if row.get(name) is not None}
    for value in spec.values():
        if isinstance(value, str) and not is_utf8(value):
            raise _Bad(Reason.BAD_STRING, ts)
    try:
        # Checked once per spec: a million schedules of a few specs cost a few checks.
        # The types first, so that 1 and True (equal as keys) are not one spec.
        key = tuple((name, type(value), value) for name, value in spec.items())
        if key not in _SPECS_CHECKED:
            Schedule.from_fields(spec)
            if len(_SPECS_CHECKED) >= 65_536:
                _SPECS_CHECKED.clear()
            _SPECS_CHECKED.add(key)
    except (ScheduleError, TypeError):
        raise _Bad(Reason.BAD_SCHEDULE, ts) from None
    return spec


_SPECS_CHECKED: set[tuple[tuple[str, type, Any], ...]] = set()


def _watch(row: dict[str, Any], raw: str | None, ts: int) -> Wire:
    op_id = _string(row, "op_id", ts)
    deadline = _long(row, "deadline_ms", ts)
    if deadline - ts > _LONG_MAX:
        raise _Bad(Reason.BAD_DEADLINE, ts)
    # The shared constant, not the row's own string: marshal writes a string it has
    # already seen in a batch as a reference.
    name = _CONDITION_NAMES.get(_string(row, "condition", ts))
    if name is None:
        raise _Bad(Reason.UNKNOWN_CONDITION, ts)
    if "keys" not in row or row["keys"] is None:
        raise _Bad(Reason.MISSING_FIELD, ts)
    keys = row["keys"]
    if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
        raise _Bad(Reason.BAD_TYPE, ts)
    if not all(is_utf8(k) for k in keys):
        raise _Bad(Reason.BAD_STRING, ts)  # a target's key is one of these, or is refused
    if len(set(keys)) != len(keys):
        raise _Bad(Reason.BAD_KEYS, ts)
    if name == "none":
        if keys:
            raise _Bad(Reason.BAD_KEYS, ts)  # `none` takes no keys
        return (ts, T_WATCH, raw, op_id, (), deadline, name, _EMPTY, 0, None, None, None,
                _target(row, ts), _payload(row, ts))
    if not keys:
        raise _Bad(Reason.BAD_KEYS, ts)
    targets: Mapping[str, int] = _EMPTY
    min_total = 0
    if name in ("all_at_least", "sum_at_least"):
        if "targets" not in row or row["targets"] is None:
            raise _Bad(Reason.MISSING_FIELD, ts)
        raw_targets = row["targets"]
        if not isinstance(raw_targets, dict) or not all(
                _is_long(v) for v in raw_targets.values()):
            raise _Bad(Reason.BAD_TYPE, ts)
        # The keys are distinct: the same size and all of them in it is set equality.
        if len(raw_targets) != len(keys) or not all(k in raw_targets for k in keys):
            raise _Bad(Reason.BAD_TARGETS, ts)
        targets = dict(raw_targets)
    if name == "sum_at_least":
        min_total = _long(row, "min_total", ts)
        if min_total < 1:
            raise _Bad(Reason.BAD_TARGETS, ts)
    return (ts, T_WATCH, raw, op_id, tuple(keys), deadline, name, targets, min_total, None,
            None, None, _target(row, ts), _payload(row, ts))


def _target(row: dict[str, Any], ts: int) -> str | None:
    """A watch's or schedule's ``target``: absent (or null), or a name."""
    target = row.get("target")
    if target is None:
        return None
    if not isinstance(target, str):
        raise _Bad(Reason.BAD_TYPE, ts)
    if TARGET_NAME.fullmatch(target) is None:
        raise _Bad(Reason.BAD_TARGET, ts)
    return target


def _payload(row: dict[str, Any], ts: int) -> str | None:
    """A watch's or schedule's ``payload`` as compact JSON text: absent (or null), or
    any JSON value of at most MAX_PAYLOAD_BYTES."""
    payload = row.get("payload")
    if payload is None:
        return None
    try:
        text = json.dumps(payload, ensure_ascii=False, separators=(",", ":"),
                          allow_nan=False)
    except ValueError:  # NaN or an infinity (1e400): JSON cannot write it back
        raise _Bad(Reason.BAD_TYPE, ts) from None
    except RecursionError:
        raise _Bad(Reason.UNPARSEABLE, ts) from None
    if not is_utf8(text):
        raise _Bad(Reason.BAD_STRING, ts)
    if len(text) > MAX_PAYLOAD_BYTES or len(text.encode("utf-8")) > MAX_PAYLOAD_BYTES:
        raise _Bad(Reason.PAYLOAD_TOO_LARGE, ts)
    return text


def _has_float(value: Any) -> bool:
    return holds(value, lambda item: isinstance(item, float))


def holds(value: Any, test: Callable[[Any], bool]) -> bool:
    """Whether ``value`` or anything in it, at any depth (a decoded JSON value: dicts'
    values and lists' items), passes ``test``. A walk with a stack of its own: a value
    nests as deep as the parser lets it."""
    stack = [value]
    while stack:
        item = stack.pop()
        if test(item):
            return True
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False
