"""The wire form's names: every position and every row type a kind test reads."""

from __future__ import annotations

import json

import pytest

from tickwheel.pipeline.contract import events
from tickwheel.pipeline.contract.events import (
    Q_RAW,
    Q_REASON,
    W_DEADLINE,
    W_KEY,
    W_KEYS,
    W_OP_ID,
    W_PAYLOAD,
    W_TARGET,
    W_TS,
    W_TYPE,
    W_VALUE,
    EventType,
    Reason,
    is_quarantined,
    parse_wire,
)


@pytest.mark.parametrize("kind", list(EventType))
def test_each_row_type_has_a_name_that_is_its_value(kind: EventType) -> None:
    assert getattr(events, f"T_{kind.name}") == kind.value


@pytest.mark.parametrize(("row", "kind"), [
    ({"ts_ms": 5, "type": "watch", "op_id": "a", "keys": [], "condition": "none",
      "deadline_ms": 9}, events.T_WATCH),
    ({"ts_ms": 5, "type": "update", "key": "k", "value": 3}, events.T_UPDATE),
    ({"ts_ms": 5, "type": "cancel", "op_id": "a"}, events.T_CANCEL),
    ({"ts_ms": 5, "type": "tick"}, events.T_TICK),
    ({"ts_ms": 5, "type": "schedule", "schedule_id": "s", "every_ms": 1000},
     events.T_SCHEDULE),
    ({"ts_ms": 5, "type": "unschedule", "schedule_id": "s"}, events.T_UNSCHEDULE),
    ({"ts_ms": 5, "type": "pause", "schedule_id": "s"}, events.T_PAUSE),
    ({"ts_ms": 5, "type": "resume", "schedule_id": "s"}, events.T_RESUME),
])
def test_a_parsed_row_carries_its_type_by_name(row: dict[str, object], kind: str) -> None:
    fields = parse_wire(json.dumps(row))
    assert not is_quarantined(fields)
    assert (fields[W_TS], fields[W_TYPE]) == (5, kind)


def test_the_named_positions_read_a_watch_and_an_update() -> None:
    watch = parse_wire(json.dumps({
        "ts_ms": 5, "type": "watch", "op_id": "order-17", "keys": ["a", "b"],
        "condition": "any_update", "deadline_ms": 9, "target": "orders",
        "payload": {"n": 1}}))
    assert (watch[W_OP_ID], watch[W_KEYS], watch[W_DEADLINE]) == ("order-17", ("a", "b"), 9)
    assert (watch[W_TARGET], json.loads(watch[W_PAYLOAD])) == ("orders", {"n": 1})
    update = parse_wire(json.dumps({"ts_ms": 6, "type": "update", "key": "a", "value": 4}))
    assert (update[W_KEY], update[W_VALUE]) == ("a", 4)


def test_a_quarantined_row_reads_by_its_own_names() -> None:
    bad = parse_wire('{"ts_ms": 5, "type": "nope"}')
    assert is_quarantined(bad)
    assert bad[Q_RAW] == '{"ts_ms": 5, "type": "nope"}'
    assert bad[Q_REASON] == Reason.UNKNOWN_TYPE.value
