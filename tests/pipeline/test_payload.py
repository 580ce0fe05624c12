"""A watch's or schedule's ``target`` and ``payload``: parsed by the contract, carried
unchanged into every outcome of it, written to the outputs, kept across restarts, and
held once per operation or schedule."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.pipeline.test_follow import WallClock, engine, land, rows
from tickwheel.pipeline.contract.events import (
    MAX_PAYLOAD_BYTES,
    Quarantined,
    canonical_line,
    compact_wire,
    parse_line,
    parse_wire,
)
from tickwheel.pipeline.contract.outcomes import OutcomeRow
from tickwheel.pipeline.contract.routing import route
from tickwheel.pipeline.engines.partitioned import run_partitioned
from tickwheel.pipeline.engines.reference import ReferenceEngine
from tickwheel.pipeline.io.outputs import read_outcomes, write_outcomes
from tickwheel.pipeline.semantics.resolver import Resolver

PAYLOAD = {"order": 17, "items": ["a", "ü"], "total": 12.5, "gift": None, "n": 2**70}


def watch(ts: int, op_id: str, deadline: int, **extra: Any) -> str:
    return json.dumps({"ts_ms": ts, "type": "watch", "op_id": op_id, "keys": [],
                       "deadline_ms": deadline, "condition": "none", **extra},
                      separators=(",", ":"))


def schedule(ts: int, schedule_id: str, every_ms: int, **extra: Any) -> str:
    return json.dumps({"ts_ms": ts, "type": "schedule", "schedule_id": schedule_id,
                       "every_ms": every_ms, **extra}, separators=(",", ":"))


def tick(ts: int) -> str:
    return json.dumps({"ts_ms": ts, "type": "tick"})


def reference(lines: list[str]) -> list[OutcomeRow]:
    engine_ = ReferenceEngine(lateness_ms=0)
    engine_.feed_lines(lines)
    return sorted(engine_.run().outcomes)


# -- the contract ----------------------------------------------------------------------


def test_a_payload_is_any_json_value_carried_as_compact_text_exactly() -> None:
    event = parse_line(watch(1, "a", 5, target="orders", payload=PAYLOAD))
    assert not isinstance(event, Quarantined)
    assert event.target == "orders"
    assert event.payload is not None and json.loads(event.payload) == PAYLOAD
    assert json.loads(event.payload)["n"] == 2**70  # not read as a float
    for value in ("text", 0, [], {}, False):
        held = parse_line(watch(1, "a", 5, payload=value))
        assert not isinstance(held, Quarantined) and held.payload == json.dumps(value)


def test_a_row_without_target_or_payload_carries_none() -> None:
    event = parse_line(watch(1, "a", 5, payload=None))
    assert not isinstance(event, Quarantined)
    assert (event.target, event.payload) == (None, None)


@pytest.mark.parametrize(("extra", "reason"), [
    ({"payload": "x" * MAX_PAYLOAD_BYTES}, "payload_too_large"),  # 2 quotes over
    ({"payload": "é" * (MAX_PAYLOAD_BYTES // 2)}, "payload_too_large"),  # bytes, not chars
    ({"target": ""}, "bad_target"),
    ({"target": "../etc"}, "bad_target"),
    ({"target": ".hidden"}, "bad_target"),
    ({"target": "x" * 65}, "bad_target"),
    ({"target": 7}, "bad_type"),
])
def test_a_payload_too_large_or_a_target_that_is_no_name_is_quarantined(
        extra: dict[str, Any], reason: str) -> None:
    for line in (watch(1, "a", 5, **extra), schedule(1, "s", 1_000, **extra)):
        quarantined = parse_line(line)
        assert isinstance(quarantined, Quarantined) and quarantined.reason.value == reason


def test_a_payload_json_cannot_write_back_is_quarantined() -> None:
    for text in ('{"ts_ms":1,"type":"watch","op_id":"a","keys":[],"deadline_ms":5,'
                 '"condition":"none","payload":NaN}',
                 '{"ts_ms":1,"type":"watch","op_id":"a","keys":[],"deadline_ms":5,'
                 '"condition":"none","payload":1e400}'):
        quarantined = parse_line(text)
        assert isinstance(quarantined, Quarantined)
        assert quarantined.reason.value == "bad_type"


def test_the_largest_payload_is_taken() -> None:
    fits = "x" * (MAX_PAYLOAD_BYTES - 2)  # with its quotes: the bound exactly
    event = parse_line(watch(1, "a", 5, payload=fits))
    assert not isinstance(event, Quarantined) and len(event.payload or "") == MAX_PAYLOAD_BYTES


def test_a_row_in_the_contracts_compact_form_travels_without_its_text() -> None:
    line = watch(1, "a", 5, target="t", payload={"k": [1, 2]})
    fields = compact_wire(line)
    assert fields[2] is None and canonical_line(fields) == line
    assert parse_wire(line)[12:] == ("t", '{"k":[1,2]}')


def test_an_operations_key_partitions_get_its_watch_without_the_payload() -> None:
    line = json.dumps({"ts_ms": 1, "type": "watch", "op_id": "a", "keys": ["k1", "k2"],
                       "deadline_ms": 9, "condition": "any_update", "payload": PAYLOAD})
    by_key, by_op = route([compact_wire(line)], 4)
    (held,) = [row for part in by_op for row in part]
    assert held[13] is not None
    assert all(row[13] is None and row[3] == "a" for part in by_key for row in part)


# -- the semantics ---------------------------------------------------------------------


def test_every_outcome_of_an_operation_carries_its_target_and_payload() -> None:
    lines = [watch(1, "expires", 5, target="a", payload={"x": 1}),
             watch(1, "cancelled", 50, target="b", payload=[1]), watch(2, "plain", 4),
             json.dumps({"ts_ms": 3, "type": "cancel", "op_id": "cancelled"}), tick(10)]
    got = {o.op_id: (o.outcome.value, o.target, o.payload) for o in reference(lines)}
    assert got == {"expires": ("expired", "a", '{"x":1}'),
                   "cancelled": ("cancelled", "b", "[1]"),
                   "plain": ("expired", None, None)}


def test_every_fire_carries_the_schedules_payload_and_a_replacing_row_replaces_it() -> None:
    lines = [schedule(0, "s", 1_000, target="coupons", payload={"v": 1}),
             schedule(2_500, "s", 1_000, target="other", payload={"v": 2}),
             tick(4_000)]
    fires = [(o.resolved_ms, o.target, o.payload) for o in reference(lines)]
    assert sorted(fires) == [(1_000, "coupons", '{"v":1}'), (2_000, "coupons", '{"v":1}'),
                             (3_000, "other", '{"v":2}'), (4_000, "other", '{"v":2}')]


def test_both_engines_and_every_partitioning_agree_on_targets_and_payloads() -> None:
    lines = [watch(t, f"op-{t}", t + 7, target=f"t{t % 3}", payload={"t": t})
             for t in range(0, 200, 3)]
    lines.append(tick(400))
    expected = reference(lines)
    assert expected and all(o.payload is not None for o in expected)
    for partitions in (1, 3):
        assert sorted(run_partitioned(lines, partitions).outcomes) == expected


def test_a_payload_is_held_once_per_operation_and_comes_back_from_a_saved_entry() -> None:
    resolver = Resolver(0)
    resolver.apply([parse_line(watch(1, "a", 50, target="x", payload={"v": 1})),
                    parse_line(schedule(1, "s", 10, payload="p"))])
    head = resolver.head()
    entries = [resolver.op_entry(op_id) for op_id in resolver.entry_ids()]
    restored = Resolver.restore_ops(head, [e for e in entries if e is not None], {"a": 1})
    restored.apply([parse_line(tick(60))])
    got = sorted((o.op_id, o.target, o.payload) for o in restored.drain()[0])
    assert ("a", "x", '{"v":1}') in got
    assert ("s@10", None, '"p"') in got and ("s@50", None, '"p"') in got


# -- the outputs and restarts ----------------------------------------------------------


def test_the_outputs_hold_the_target_and_the_payloads_json_text(tmp_path: Path) -> None:
    rows_ = reference([watch(1, "a", 2, target="t", payload=PAYLOAD), tick(5)])
    path = write_outcomes(rows_, tmp_path / "outcomes")
    (back,) = list(read_outcomes(path))
    assert back == rows_[0] and back.payload_value() == PAYLOAD
    assert back.target == "t"


def test_a_payload_is_the_same_after_a_restart(tmp_path: Path) -> None:
    inbox = tmp_path / "in"
    inbox.mkdir()
    clock = WallClock(1_000)
    follower = engine(tmp_path, clock)
    land(inbox, "a.jsonl", [watch(1_000, "later", 5_000, target="t", payload=PAYLOAD),
                            schedule(1_000, "s", 2_000, payload={"s": 1})])
    follower.step()
    del follower  # as a kill would leave it: the next start reads the checkpoint
    again = engine(tmp_path, clock)
    clock.ms = 6_000
    again.step()
    got = {r["op_id"]: (r["target"], r["payload"]) for r in rows(tmp_path / "out" / "outcomes")}
    assert json.loads(got["later"][1]) == PAYLOAD and got["later"][0] == "t"
    assert got["s@2000"] == (None, '{"s":1}') and got["s@4000"] == (None, '{"s":1}')
