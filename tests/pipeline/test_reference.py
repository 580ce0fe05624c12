"""The reference engine: the pipeline's semantics, rule by rule."""

from __future__ import annotations

import io
import json
import random
import tracemalloc
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.pipeline.logs import LATENESS_MS, random_log
from tickwheel.pipeline.contract.events import (
    MAX_ROW_CHARS,
    TOO_LONG_KEPT_CHARS,
    Condition,
    Event,
    EventType,
    OutcomeKind,
    Quarantined,
    Reason,
    compact_wire,
    parse_line,
    parse_row,
    parse_wire,
)
from tickwheel.pipeline.contract.outcomes import OutcomeRow
from tickwheel.pipeline.engines.reference import ReferenceEngine, RunResult
from tickwheel.pipeline.io.log_reader import json_lines, read_events
from tickwheel.pipeline.io.outputs import read_parquet_rows, write_outcomes
from tickwheel.pipeline.tools.generator import GeneratorConfig, generate

ISSUE_EXAMPLE = """\
{"ts_ms": 1000, "type": "watch", "op_id": "produce-17", "keys": ["t-0", "t-1"], "deadline_ms": 31000, "condition": "all_at_least", "targets": {"t-0": 120, "t-1": 88}}
{"ts_ms": 1000, "type": "watch", "op_id": "fetch-3", "keys": ["t-0", "t-1"], "deadline_ms": 1500, "condition": "sum_at_least", "targets": {"t-0": 100, "t-1": 50}, "min_total": 5}
{"ts_ms": 1002, "type": "watch", "op_id": "session-g1-m3", "keys": ["g1/m3"], "deadline_ms": 11002, "condition": "any_update"}
{"ts_ms": 1003, "type": "watch", "op_id": "task-9", "keys": [], "deadline_ms": 60000, "condition": "none"}
{"ts_ms": 1010, "type": "update", "key": "t-0", "value": 125}
{"ts_ms": 1011, "type": "update", "key": "t-1", "error": "NOT_LEADER"}
{"ts_ms": 1020, "type": "cancel", "op_id": "task-9"}
{"ts_ms": 9000, "type": "tick"}
"""  # noqa: E501


def run(rows: list[dict[str, object]] | str, lateness_ms: int = 10_000,
        dedupe_retention_ms: int | None = None) -> RunResult:
    engine = ReferenceEngine(lateness_ms=lateness_ms, dedupe_retention_ms=dedupe_retention_ms)
    if isinstance(rows, str):
        engine.feed_lines(rows.splitlines())
    else:
        engine.feed_lines(json.dumps(r) for r in rows)
    return engine.run()


def by_id(result: RunResult) -> dict[str, OutcomeRow]:
    return {o.op_id: o for o in result.outcomes}


def watch(ts: int, op: str, keys: list[str], deadline: int, condition: str = "any_update",
          **extra: object) -> dict[str, object]:
    return {"ts_ms": ts, "type": "watch", "op_id": op, "keys": keys, "deadline_ms": deadline,
            "condition": condition, **extra}


def update(ts: int, key: str, value: int | None = None,
           error: str | None = None) -> dict[str, object]:
    row: dict[str, object] = {"ts_ms": ts, "type": "update", "key": key}
    if value is not None:
        row["value"] = value
    if error is not None:
        row["error"] = error
    return row


def test_the_issue_example() -> None:
    result = run(ISSUE_EXAMPLE)
    out = by_id(result)
    assert out["fetch-3"] == OutcomeRow("fetch-3", OutcomeKind.COMPLETED, 1010, 10,
                                        ("t-0", "t-1"), None)
    assert out["produce-17"] == OutcomeRow("produce-17", OutcomeKind.ERROR, 1011, 11,
                                           ("t-0", "t-1"), "NOT_LEADER")
    assert out["task-9"] == OutcomeRow("task-9", OutcomeKind.CANCELLED, 1020, 17, (), None)
    assert "session-g1-m3" not in out and result.pending == 1
    assert (result.rows_in, result.rows_applied, len(result.quarantine)) == (8, 8, 0)


def test_watches_come_before_updates_at_one_ts_whatever_the_file_order() -> None:
    result = run([update(5, "k", 1), watch(5, "w", ["k"], 100)])
    assert by_id(result)["w"].outcome is OutcomeKind.COMPLETED  # the update counts as later
    assert by_id(result)["w"].resolved_ms == 5


def test_deadlines_at_t_expire_before_the_events_at_t() -> None:
    result = run([watch(0, "w", ["k"], 50), update(50, "k", 1)])
    assert by_id(result)["w"] == OutcomeRow("w", OutcomeKind.EXPIRED, 50, 50, ("k",), None)


def test_a_watch_already_past_its_deadline_tries_once_then_expires_at_its_ts() -> None:
    result = run([update(0, "k", 10),
                  watch(7, "met", ["k"], 3, "all_at_least", targets={"k": 5}),
                  watch(7, "unmet", ["k"], 7, "all_at_least", targets={"k": 50})])
    out = by_id(result)
    assert (out["met"].outcome, out["met"].resolved_ms) == (OutcomeKind.COMPLETED, 7)
    assert (out["unmet"].outcome, out["unmet"].resolved_ms) == (OutcomeKind.EXPIRED, 7)


def test_values_only_grow_and_sums_floor_each_key_at_zero() -> None:
    result = run([update(0, "a", 100), update(1, "a", 50),  # stays at 100
                  watch(2, "sum", ["a", "b"], 1_000, "sum_at_least",
                        targets={"a": 90, "b": 500}, min_total=15),
                  update(3, "b", 0),  # below its start: contributes 0, not -500
                  update(4, "a", 104),
                  update(5, "a", 105)])
    assert (by_id(result)["sum"].resolved_ms, by_id(result)["sum"].outcome) == (
        5, OutcomeKind.COMPLETED)


def test_all_at_least_needs_a_value_for_every_key() -> None:
    result = run([watch(0, "p", ["a", "b"], 1_000, "all_at_least", targets={"a": 1, "b": 0}),
                  update(1, "a", 5), update(2, "b", 0)])
    assert by_id(result)["p"].resolved_ms == 2


def test_any_update_completes_on_an_update_that_does_not_raise_the_value() -> None:
    result = run([update(0, "m", 9), watch(1, "s", ["m"], 100), update(2, "m", 3)])
    assert by_id(result)["s"].resolved_ms == 2


def test_the_smallest_error_wins_at_one_ts() -> None:
    result = run([watch(0, "p", ["a", "b"], 100, "all_at_least", targets={"a": 1, "b": 1}),
                  update(5, "b", error="UNKNOWN_TOPIC_OR_PARTITION"),
                  update(5, "a", error="NOT_LEADER")])
    assert by_id(result)["p"].error == "NOT_LEADER"
    assert by_id(result)["p"].outcome is OutcomeKind.ERROR


def test_errors_come_after_values_at_one_ts() -> None:
    result = run([watch(0, "p", ["a"], 100, "all_at_least", targets={"a": 1}),
                  update(5, "a", error="NOT_LEADER"), update(5, "a", 1)])
    assert by_id(result)["p"].outcome is OutcomeKind.COMPLETED


def test_cancels_of_unknown_or_resolved_operations_are_counted_not_outcomes() -> None:
    result = run([watch(0, "w", ["k"], 100), update(1, "k", 1),
                  {"ts_ms": 2, "type": "cancel", "op_id": "w"},
                  {"ts_ms": 2, "type": "cancel", "op_id": "never"}])
    assert [o.outcome for o in result.outcomes] == [OutcomeKind.COMPLETED]
    assert result.ignored_cancels == 2


def test_duplicate_op_ids_keep_only_a_unique_earliest_watch() -> None:
    result = run([watch(1, "a", ["k"], 100), watch(2, "a", ["k"], 100),
                  watch(3, "b", ["k"], 100), watch(3, "b", ["j"], 100),
                  watch(9, "b", ["k"], 100)])
    reasons = [q.reason for q in result.quarantine]
    assert reasons == [Reason.DUPLICATE_OP_ID] * 4  # a's second, and all three b's
    assert result.rows_applied == 1


def test_copies_of_one_watch_are_one_watch_and_the_least_text_is_kept() -> None:
    spaced = json.dumps(watch(1, "a", ["k"], 100))
    compact = json.dumps(watch(1, "a", ["k"], 100), separators=(",", ":"))
    reordered = json.dumps({"condition": "any_update", "deadline_ms": 100, "keys": ["k"],
                            "op_id": "a", "type": "watch", "ts_ms": 1})
    for order in ([spaced, compact, reordered], [reordered, compact, spaced]):
        result = run("\n".join([*order, json.dumps(update(2, "k", 1))]))
        assert [(o.op_id, o.outcome) for o in result.outcomes] == [("a", OutcomeKind.COMPLETED)]
        assert sorted(q.raw for q in result.quarantine) == sorted({spaced, compact, reordered}
                                                                   - {min(order)})
        assert {q.reason for q in result.quarantine} == {Reason.DUPLICATE_OP_ID}


def test_two_different_watches_of_one_id_at_one_time_are_both_quarantined() -> None:
    result = run([watch(1, "a", ["k"], 100), watch(1, "a", ["k"], 101),
                  watch(1, "b", ["k"], 100), watch(1, "b", ["j"], 100),
                  watch(2, "a", ["k"], 100), update(3, "k", 1)])
    assert result.outcomes == []
    assert [q.reason for q in result.quarantine] == [Reason.DUPLICATE_OP_ID] * 5


def test_a_dedupe_retention_forgets_an_op_id_once_it_passed_and_the_operation_resolved(
        ) -> None:
    rows = [watch(1, "a", [], 5, "none"),
            watch(101, "a", [], 300, "none"),  # 1 + 100 has not passed: a duplicate
            watch(102, "a", [], 300, "none"),  # it has: a new operation
            watch(10, "p", ["k"], 1_000),
            watch(200, "p", ["k"], 1_000),  # past the retention, but p is pending
            update(400, "k", 1),
            watch(401, "p", ["k"], 450),  # p resolved at 400: a new operation
            {"ts_ms": 2_000, "type": "tick"}]
    kept = run(rows, dedupe_retention_ms=100)
    assert sorted((o.op_id, o.resolved_ms, o.outcome.value) for o in kept.outcomes) == [
        ("a", 5, "expired"), ("a", 300, "expired"), ("p", 400, "completed"),
        ("p", 450, "expired")]
    assert [(q.reason, q.ts_ms) for q in kept.quarantine] == [
        (Reason.DUPLICATE_OP_ID, 101), (Reason.DUPLICATE_OP_ID, 200)]
    forever = run(rows)
    assert [q.ts_ms for q in forever.quarantine] == [101, 102, 200, 401]


def test_a_dedupe_retention_bounds_the_op_ids_remembered() -> None:
    from tickwheel.pipeline.contract.events import Event, parse_line
    from tickwheel.pipeline.semantics.resolver import Resolver

    def watches(resolver: Resolver) -> int:
        for ts in range(5_000):
            ev = parse_line(json.dumps(watch(ts, f"op-{ts}", [], ts + 10, "none")))
            assert isinstance(ev, Event)
            resolver.apply([ev])
        return len(resolver.seen_op_ids)

    assert watches(Resolver(dedupe_retention_ms=100)) <= 101 + 10
    assert watches(Resolver()) == 5_000
    with pytest.raises(ValueError, match="dedupe_retention_ms"):
        Resolver(dedupe_retention_ms=-1)


@pytest.mark.parametrize(("line", "reason", "ts"), [
    ("not json", Reason.UNPARSEABLE, None),
    ("[1, 2]", Reason.UNPARSEABLE, None),
    ('{"type": "tick"}', Reason.MISSING_FIELD, None),
    ('{"ts_ms": 1.5, "type": "tick"}', Reason.BAD_TYPE, None),
    ('{"ts_ms": true, "type": "tick"}', Reason.BAD_TYPE, None),
    ('{"ts_ms": 9223372036854775808, "type": "tick"}', Reason.BAD_TYPE, None),
    ('{"ts_ms": NaN, "type": "tick"}', Reason.BAD_TYPE, None),
    ('{"ts_ms": 1e400, "type": "tick"}', Reason.BAD_TYPE, None),
    ('{"ts_ms": 1, "type": "update", "key": "k", "value": -9223372036854775809}',
     Reason.BAD_TYPE, 1),
    ('{"ts_ms": 1, "type": "watch", "op_id": "o", "keys": ["k"], "deadline_ms": 9, '
     '"condition": "all_at_least", "targets": {"k": 18446744073709551616}}', Reason.BAD_TYPE, 1),
    ('{"ts_ms": 1, "type": "poke"}', Reason.UNKNOWN_TYPE, 1),
    ('{"ts_ms": 1, "type": "update", "key": "k", "value": "5"}', Reason.BAD_TYPE, 1),
    ('{"ts_ms": 1, "type": "update", "key": 7, "value": 5}', Reason.BAD_TYPE, 1),
    ('{"ts_ms": 1, "type": "update", "key": "k"}', Reason.MISSING_FIELD, 1),
    ('{"ts_ms": 1, "type": "update", "key": "k", "value": 1, "error": "E"}',
     Reason.VALUE_AND_ERROR, 1),
    ('{"ts_ms": 1, "type": "cancel"}', Reason.MISSING_FIELD, 1),
    ('{"ts_ms": 1, "type": "watch", "op_id": "o", "keys": ["k"], "deadline_ms": 9, '
     '"condition": "soon"}', Reason.UNKNOWN_CONDITION, 1),
    ('{"ts_ms": 1, "type": "watch", "op_id": "o", "keys": ["k"], "deadline_ms": 9, '
     '"condition": "all_at_least", "targets": {"j": 1}}', Reason.BAD_TARGETS, 1),
    ('{"ts_ms": 1, "type": "watch", "op_id": "o", "keys": ["k"], "deadline_ms": 9, '
     '"condition": "all_at_least", "targets": {"k": 1, "j": 2}}', Reason.BAD_TARGETS, 1),
    ('{"ts_ms": 1, "type": "watch", "op_id": "o", "keys": ["k"], "deadline_ms": 9, '
     '"condition": "sum_at_least", "targets": {"k": 1}, "min_total": 0}', Reason.BAD_TARGETS, 1),
    ('{"ts_ms": 1, "type": "watch", "op_id": "o", "keys": ["k", "k"], "deadline_ms": 9, '
     '"condition": "any_update"}', Reason.BAD_KEYS, 1),
    ('{"ts_ms": 1, "type": "watch", "op_id": "o", "keys": [], "deadline_ms": 9, '
     '"condition": "any_update"}', Reason.BAD_KEYS, 1),
    ('{"ts_ms": 1, "type": "watch", "op_id": "o", "keys": ["k"], "deadline_ms": 9, '
     '"condition": "none"}', Reason.BAD_KEYS, 1),
    ('{"ts_ms": 1, "type": "watch", "op_id": 5, "keys": ["k"], "deadline_ms": 9, '
     '"condition": "any_update"}', Reason.BAD_TYPE, 1),
    ('{"ts_ms": -2, "type": "watch", "op_id": "o", "keys": [], '
     '"deadline_ms": 9223372036854775806, "condition": "none"}', Reason.BAD_DEADLINE, -2),
    # Lone surrogates are valid JSON but no UTF-8 output can hold them.
    ('{"ts_ms": 1, "type": "watch", "op_id": "\\ud800", "keys": [], "deadline_ms": 9, '
     '"condition": "none"}', Reason.BAD_STRING, 1),
    ('{"ts_ms": 1, "type": "watch", "op_id": "o", "keys": ["a\\udfff"], "deadline_ms": 9, '
     '"condition": "any_update"}', Reason.BAD_STRING, 1),
    ('{"ts_ms": 1, "type": "update", "key": "\\ud800k", "value": 5}', Reason.BAD_STRING, 1),
    ('{"ts_ms": 1, "type": "update", "key": "k", "error": "\\udc80"}', Reason.BAD_STRING, 1),
    ('{"ts_ms": 1, "type": "cancel", "op_id": "\\ud800"}', Reason.BAD_STRING, 1),
    # A name given twice: JSON readers disagree on which value counts, so none does.
    ('{"ts_ms": 1, "type": "cancel", "op_id": "a", "op_id": "b"}', Reason.DUPLICATE_FIELD, 1),
    ('{"ts_ms": 1, "ts_ms": 2, "type": "tick"}', Reason.DUPLICATE_FIELD, None),
    ('{"ts_ms": 1, "type": "cancel", "op_id": "a:b", "\\u006fp_id": "a:b"}',
     Reason.DUPLICATE_FIELD, 1),
    ('{"ts_ms": 1, "type": "watch", "op_id": "o", "keys": ["k"], "deadline_ms": 9, '
     '"condition": "all_at_least", "targets": {"k": 1, "k": 2}}', Reason.DUPLICATE_FIELD, 1),
    ('{"ts_ms": 1, "type": "tick", "extra": [{"x": 1, "x": 1}]}', Reason.DUPLICATE_FIELD, 1),
])
def test_malformed_rows_are_quarantined_with_a_reason(line: str, reason: Reason,
                                                      ts: int | None) -> None:
    result = run(line + "\n\n")  # the blank line is not a row
    assert [(q.raw, q.reason, q.ts_ms) for q in result.quarantine] == [(line, reason, ts)]
    assert result.rows_in == 1 and result.rows_applied == 0 and result.outcomes == []


def test_well_formed_rows_parse_to_events_with_every_field_in_its_place() -> None:
    watch_line = ('{"ts_ms": 1, "type": "watch", "op_id": "o", "keys": ["a", "b"], '
                  '"deadline_ms": 9, "condition": "sum_at_least", "targets": {"a": 1, "b": 2}, '
                  '"min_total": 3}')
    cases = [
        (watch_line, Event(1, EventType.WATCH, watch_line, op_id="o", keys=("a", "b"),
                           deadline_ms=9, condition=Condition.SUM_AT_LEAST,
                           targets={"a": 1, "b": 2}, min_total=3)),
        ('{"ts_ms": 2, "type": "update", "key": "a", "value": 7}',
         Event(2, EventType.UPDATE, '{"ts_ms": 2, "type": "update", "key": "a", "value": 7}',
               key="a", value=7)),
        ('{"ts_ms": 3, "type": "update", "key": "a", "error": "E"}',
         Event(3, EventType.UPDATE, '{"ts_ms": 3, "type": "update", "key": "a", "error": "E"}',
               key="a", error="E")),
        ('{"ts_ms": 4, "type": "cancel", "op_id": "o"}',
         Event(4, EventType.CANCEL, '{"ts_ms": 4, "type": "cancel", "op_id": "o"}', op_id="o")),
        ('{"ts_ms": 5, "type": "tick"}', Event(5, EventType.TICK, '{"ts_ms": 5, "type": "tick"}')),
    ]
    for line, expected in cases:
        event = parse_line(line)
        assert type(event) is Event
        assert event == expected
        assert event._asdict() == expected._asdict()


@pytest.mark.parametrize("line", [
    '{"ts_ms":1,"type":"watch","op_id":"o","keys":["host:9092"],"deadline_ms":9,'
    '"condition":"any_update"}',
    '{"ts_ms":1,"type":"update","key":"a:b:c","value":2,"note":{"a":"x:y","b":[{":":1}]}}',
    '{"ts_ms":1,"type":"cancel","op_id":"a","op_id":"a"}',
    '{"ts_ms":1,"type":"tick","x":{"y":{"z":":","z":":"}}}',
])
def test_every_parser_agrees_on_names_given_twice_and_colons_in_strings(line: str) -> None:
    # A colon inside a string must not refuse a row, and a repeat beside such
    # colons must not pass.
    repeated = line.count('"op_id"') == 2 or line.count('"z"') == 2
    parsed = parse_line(line)
    assert (type(parsed) is Quarantined) == repeated
    if repeated:
        assert parse_wire(line) == compact_wire(line) == (line, "duplicate_field", 1)
    else:  # the same fields; compact_wire may leave the raw line out
        wire, compact = parse_wire(line), compact_wire(line)
        assert type(parsed) is Event and wire[:2] + wire[3:] == compact[:2] + compact[3:]


def test_escaped_surrogate_pairs_and_non_ascii_text_parse() -> None:
    line = '{"ts_ms": 1, "type": "update", "key": "\\ud83d\\ude00 é", "value": 2}'
    event = parse_line(line)
    assert type(event) is Event and event.key == "\U0001f600 é" and event.value == 2


_VALUES = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70), st.floats(), st.booleans(), st.none(),
    st.text(max_size=4), st.sampled_from(["watch", "update", "cancel", "tick", "all_at_least",
                                          "sum_at_least", "any_update", "none", "k", "j"]),
    st.lists(st.sampled_from(["k", "j", 1]), max_size=3),
    st.dictionaries(st.sampled_from(["k", "j"]), st.integers(min_value=-(2**65),
                                                             max_value=2**65)))
_FIELDS = ["ts_ms", "type", "op_id", "keys", "deadline_ms", "condition", "targets",
           "min_total", "key", "value", "error", "colour"]


@settings(max_examples=400, deadline=None)
@given(st.dictionaries(st.sampled_from(_FIELDS), _VALUES), st.booleans(), st.text(max_size=8))
def test_a_row_parses_as_the_json_module_decodes_it(fields: dict[str, object], mangle: bool,
                                                     garbage: str) -> None:
    # parse_line may decode with orjson when it is installed: the rows must be the same.
    line = json.dumps(fields, allow_nan=True)
    if mangle:
        line = line[: len(line) // 2] + garbage
    names: list[list[str]] = []
    try:
        decoded = json.loads(line, object_pairs_hook=lambda pairs: (
            names.append([name for name, _ in pairs]) or dict(pairs)))
    except (ValueError, RecursionError):
        decoded = None
    parsed = parse_line(line)
    if isinstance(decoded, dict) and any(len(set(group)) != len(group) for group in names):
        assert type(parsed) is Quarantined and parsed.reason is Reason.DUPLICATE_FIELD
    elif isinstance(decoded, dict):
        assert parsed == parse_row(decoded, line)
    else:
        assert parsed == Quarantined(line, Reason.UNPARSEABLE, None)


@pytest.mark.parametrize("value", [
    2**62 - 1, 2**62, -(2**62) + 1, -(2**62), -(2**62) - 1, 2**63 - 1, -(2**63)])
def test_every_64_bit_value_is_a_long(value: int) -> None:
    # Around 2**62 the compiled parser moves from unboxed to boxed ints.
    line = f'{{"ts_ms": 1, "type": "update", "key": "k", "value": {value}}}'
    assert parse_line(line) == Event(1, EventType.UPDATE, line, key="k", value=value)
    assert isinstance(parse_line(line.replace(str(value), str(value * 4))), Quarantined)


def test_latencies_at_the_edges_of_a_long_are_written(tmp_path: Path) -> None:
    # The longest wait a watch may have, from the earliest time, ends at the latest:
    # its latency is still a long, so the outcome can be written.
    low, high = -(2**63), 2**63 - 1
    result = run([watch(low, "first", ["k"], -1), watch(0, "last", ["k"], high),
                  watch(0, "none", [], high, condition="none"), update(high, "k", 1)])
    assert sorted((o.op_id, o.outcome, o.latency_ms) for o in result.outcomes) == [
        ("first", OutcomeKind.EXPIRED, high), ("last", OutcomeKind.EXPIRED, high),
        ("none", OutcomeKind.EXPIRED, high)]
    write_outcomes(result.outcomes, tmp_path)
    assert len(read_parquet_rows(tmp_path)) == 3


def test_unknown_fields_and_targets_of_other_conditions_are_ignored() -> None:
    result = run([watch(0, "w", ["k"], 100, targets={"zzz": 1}, colour="blue"),
                  update(1, "k", 1)])
    assert by_id(result)["w"].outcome is OutcomeKind.COMPLETED


def test_late_rows_are_quarantined_and_nothing_is_lost() -> None:
    rows = [watch(50_000, "w", ["k"], 90_000), update(39_999, "k", 1),  # late by 1 ms
            update(40_000, "k", 2), {"ts_ms": 60_000, "type": "tick"}, "garbage"]
    engine = ReferenceEngine(lateness_ms=10_000)
    engine.feed_lines(r if isinstance(r, str) else json.dumps(r) for r in rows)
    result = engine.run()
    assert [(q.reason, q.ts_ms) for q in result.quarantine] == [
        (Reason.LATE, 39_999), (Reason.UNPARSEABLE, None)]
    assert result.rows_in == result.rows_applied + len(result.quarantine) == 5
    assert result.pending == 1  # the update at 40,000 came before the watch at 50,000


def test_outcomes_do_not_depend_on_row_order_within_the_lateness_bound() -> None:
    rng = random.Random(3)
    rows: list[dict[str, object]] = []
    for i in range(300):
        ts = i * 10
        keys = rng.sample([f"k{j}" for j in range(8)], rng.randint(1, 3))
        cond = rng.choice(["all_at_least", "sum_at_least", "any_update", "none"])
        extra: dict[str, object] = {}
        if cond == "all_at_least":
            extra["targets"] = {k: rng.randint(0, 40) for k in keys}
        elif cond == "sum_at_least":
            extra.update(targets={k: rng.randint(0, 20) for k in keys},
                         min_total=rng.randint(1, 30))
        rows.append(watch(ts, f"op{i}", [] if cond == "none" else keys,
                          ts + rng.randint(-5, 400), cond, **extra))
        for _ in range(2):
            rows.append(update(ts + rng.randint(0, 9), rng.choice(keys), rng.randint(0, 60)))
        if rng.random() < 0.1:
            rows.append(update(ts, rng.choice(keys), error=rng.choice(["E1", "E2"])))
        if rng.random() < 0.1:
            rows.append({"ts_ms": ts + 5, "type": "cancel", "op_id": f"op{rng.randrange(i + 1)}"})
    reference = sorted(run(rows).outcomes, key=lambda o: o.op_id)
    assert len(reference) > 200
    for _ in range(5):
        shuffled = rows[:]
        # Disorder within the bound: shuffle inside windows of 50 rows (< 10 s apart).
        for start in range(0, len(shuffled), 50):
            window = shuffled[start:start + 50]
            rng.shuffle(window)
            shuffled[start:start + 50] = window
        again = run(shuffled)
        assert not again.quarantine
        assert sorted(again.outcomes, key=lambda o: o.op_id) == reference


_LINE_PARTS = [b'{"ts_ms": 1}', b"\n", b"\r\n", b"\r", b"", b"   ", b"\xff\xfe", b"\xe2\x82",
               b"\xe2\x82\xac", "\u2028".encode(), b"\x0c", b"\xef\xbb\xbf", b"x" * 7]


@settings(max_examples=300, deadline=None)
@given(parts=st.lists(st.sampled_from(_LINE_PARTS), max_size=40),
       slice_bytes=st.integers(min_value=1, max_value=64),
       max_chars=st.integers(min_value=1, max_value=40))
def test_a_file_held_in_memory_has_the_lines_a_file_read_from_disk_has(
        parts: list[bytes], slice_bytes: int, max_chars: int,
        tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """The Spark engine reads JSON Lines files in slices and splits them in its
    packers; the reference engine reads them from disk as text. Both see the same
    rows, long ones cut alike."""
    content = b"".join(parts)
    directory = tmp_path_factory.mktemp("lines")
    (directory / "events.jsonl").write_bytes(content)
    from_disk = [(r.raw, r.reason) if isinstance(r, Quarantined) else r
                 for r in read_events(directory, max_chars=max_chars)]
    held = [line for lines in json_lines(content, slice_bytes, max_chars=max_chars)
            for line in lines if line.strip()]
    from_memory = [(r.raw, r.reason) if isinstance(r, Quarantined) else r
                   for r in map(parse_line, held)]
    assert from_memory == from_disk


class _Reads(io.BytesIO):
    """A stream that remembers how much each read asked for."""

    def __init__(self, content: bytes) -> None:
        super().__init__(content)
        self.asked: list[int] = []

    def read(self, size: int | None = -1) -> bytes:
        self.asked.append(-1 if size is None else size)
        return super().read(size)


@settings(max_examples=200, deadline=None)
@given(parts=st.lists(st.sampled_from(_LINE_PARTS), max_size=40),
       slice_bytes=st.integers(min_value=1, max_value=64))
def test_a_stream_has_the_lines_of_its_bytes_and_is_read_a_slice_at_a_time(
        parts: list[bytes], slice_bytes: int) -> None:
    content = b"".join(parts)
    stream = _Reads(content)
    from_stream = [line for lines in json_lines(stream, slice_bytes) for line in lines]
    assert from_stream == [line for lines in json_lines(content, slice_bytes)
                           for line in lines]
    assert set(stream.asked) <= {slice_bytes}  # never the whole file at once


def _lines_of(content: bytes, max_chars: int) -> list[str]:
    """What a line is: UTF-8 with bad bytes replaced, a byte order mark opening the
    input left out, universal newlines, each line cut to max_chars + 1 characters."""
    text = content.removeprefix(b"\xef\xbb\xbf").decode("utf-8", "replace")
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    lines = text.split("\n")
    if not lines[-1]:
        lines.pop()
    return [line[:max_chars + 1] for line in lines]


@settings(max_examples=300, deadline=None)
@given(parts=st.lists(st.sampled_from([*_LINE_PARTS, "\u20ac".encode() * 9, b"y" * 30]),
                      max_size=40),
       slice_bytes=st.integers(min_value=1, max_value=64),
       max_chars=st.integers(min_value=1, max_value=40))
def test_lines_are_cut_after_the_longest_row_however_the_input_is_sliced(
        parts: list[bytes], slice_bytes: int, max_chars: int) -> None:
    content = b"".join(parts)
    lines = [line for chunk in json_lines(content, slice_bytes, max_chars=max_chars)
             for line in chunk]
    assert lines == _lines_of(content, max_chars)


@pytest.mark.parametrize("slice_bytes", [1, 2, 3, 64])
def test_a_byte_order_mark_opens_a_file_and_is_not_part_of_its_first_row(
        slice_bytes: int) -> None:
    bom = b"\xef\xbb\xbf"
    row = b'{"ts_ms": 1, "type": "tick"}'
    lines = [line for chunk in json_lines(bom + row + b"\r\n" + bom + row + b"\n",
                                          slice_bytes) for line in chunk]
    assert lines == [row.decode(), "\ufeff" + row.decode()]  # only the file's first
    assert isinstance(parse_line(lines[0]), Event)
    assert parse_line(lines[1]) == Quarantined(lines[1], Reason.UNPARSEABLE, None)
    for short in (bom[:1], bom[:2], bom, bom[:2] + b"x"):  # inputs shorter than a row
        assert [line for chunk in json_lines(short, slice_bytes) for line in chunk] == (
            _lines_of(short, MAX_ROW_CHARS))


class _LongLine(io.RawIOBase):
    """A stream of one line of ``size`` bytes, then a tick row, made as it is read."""

    def __init__(self, size: int) -> None:
        self.left = size
        self.tail = b'\r\n{"ts_ms": 7, "type": "tick"}\n'

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        if self.left:
            n = min(size, self.left)
            self.left -= n
            return b"x" * n
        out, self.tail = self.tail[:size], self.tail[size:]
        return out


def test_a_line_too_long_to_keep_is_read_past_in_bounded_memory(tmp_path: Path) -> None:
    tracemalloc.start()
    try:
        lines = [line for chunk in json_lines(_LongLine(256 << 20), slice_bytes=1 << 20)
                 for line in chunk]
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert lines == ["x" * (MAX_ROW_CHARS + 1), '{"ts_ms": 7, "type": "tick"}']
    assert peak < 24 << 20  # a few times the 4 MiB kept of the line, whatever its length
    size = 128 << 20
    (tmp_path / "big.jsonl").write_bytes(
        b'{"ts_ms": 1, "type": "tick", "pad": "' + b"x" * size + b'"}\n'
        b'{"ts_ms": 7, "type": "tick"}\n')
    tracemalloc.start()
    try:
        rows = list(read_events(tmp_path))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 32 << 20  # the same, read 8 MiB at a time
    assert isinstance(rows[0], Quarantined) and isinstance(rows[1], Event)
    assert rows[0].reason is Reason.TOO_LONG and rows[0].ts_ms is None
    assert rows[0].raw == '{"ts_ms": 1, "type": "tick", "pad": "' + "x" * (
        TOO_LONG_KEPT_CHARS - 37)


def test_reading_reports_every_byte_of_every_file_as_it_goes(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "a.jsonl").write_bytes(b'{"ts_ms": 1, "type": "tick"}\n' * 5_000)
    pq.write_table(pa.table({"ts_ms": [2], "type": ["tick"]}), tmp_path / "b.parquet")
    heard: list[tuple[int, int]] = []  # (rows read by then, bytes)
    rows: list[object] = []
    for row in read_events(tmp_path, on_bytes=lambda n: heard.append((len(rows), n))):
        rows.append(row)
    assert len(rows) == 5_001
    assert sum(n for _, n in heard) == sum(p.stat().st_size for p in tmp_path.iterdir())
    assert heard[0][0] == 0 and heard[-1][0] == 5_001  # as it goes, not all at the end


def test_a_file_gone_between_listing_and_reading_is_passed_over_with_a_warning(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    from tickwheel.pipeline.io import log_reader

    (tmp_path / "b.jsonl").write_text('{"ts_ms": 1, "type": "tick"}\n')
    listed = [tmp_path / "a.jsonl", tmp_path / "b.jsonl"]  # a.jsonl: moved away since
    monkeypatch.setattr(log_reader, "input_files", lambda directory: listed)
    rows = list(read_events(tmp_path))
    assert [type(row) for row in rows] == [Event]
    assert "a.jsonl went away before it was read" in caplog.text


def test_a_row_longer_than_the_limit_is_quarantined_unparsed_keeping_its_start() -> None:
    head = '{"ts_ms": 1, "type": "tick", "pad": "'
    longest = head + "x" * (MAX_ROW_CHARS - len(head) - 2) + '"}'
    too_long = longest[:-2] + 'x"}'
    assert len(longest) == MAX_ROW_CHARS
    assert type(parse_line(longest)) is Event
    assert parse_wire(too_long) == compact_wire(too_long) == (
        too_long[:TOO_LONG_KEPT_CHARS], "too_long", None)
    assert parse_row(json.loads(too_long), too_long) == Quarantined(
        too_long[:TOO_LONG_KEPT_CHARS], Reason.TOO_LONG, None)
    result = run(f"{too_long}\n{longest}\n")
    assert [(q.reason, len(q.raw)) for q in result.quarantine] == [
        (Reason.TOO_LONG, TOO_LONG_KEPT_CHARS)]
    assert result.rows_in == 2 and result.rows_applied == 1


def test_a_line_longer_than_a_slice_comes_whole() -> None:
    long_line = b'{"ts_ms": 1, "type": "tick", "pad": "' + b"x" * 10_000 + b'"}'
    content = b"a\n" + long_line + b"\r\nb"
    assert [line for lines in json_lines(content, slice_bytes=7) for line in lines] == [
        "a", long_line.decode(), "b"]


def test_lines_come_in_slices_of_about_the_size_asked() -> None:
    content = b"".join(b'{"ts_ms": %d}\n' % n for n in range(1000))
    slices = list(json_lines(content, slice_bytes=1000))
    assert len(slices) > 10
    assert [line for lines in slices for line in lines] == content.decode().splitlines()
    with pytest.raises(ValueError, match="slice_bytes"):
        list(json_lines(content, slice_bytes=0))


# -- a log larger than memory ---------------------------------------------------------


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("spill_events", [1, 7, 250])
@pytest.mark.parametrize("retention", [None, 300])
def test_a_log_sorted_on_disk_resolves_exactly_as_one_sorted_in_memory(
        seed: int, spill_events: int, retention: int | None) -> None:
    lines = random_log(seed)
    in_memory = ReferenceEngine(lateness_ms=LATENESS_MS, dedupe_retention_ms=retention,
                                spill_events=None)
    in_memory.feed_lines(lines)
    on_disk = ReferenceEngine(lateness_ms=LATENESS_MS, dedupe_retention_ms=retention,
                              spill_events=spill_events)
    on_disk.feed_lines(lines)
    assert on_disk.spilled_runs >= len(lines) // spill_events // 2 > 0
    # Equal as lists, in order: the same rows, outcomes and counts, in the same order.
    assert on_disk.run() == in_memory.run()


def test_a_log_sorted_on_disk_is_resolved_a_batch_at_a_time_counting_as_it_goes() -> None:
    lines = random_log(1)
    engine = ReferenceEngine(lateness_ms=LATENESS_MS, spill_events=100)
    engine.feed_lines(lines)
    applied = [engine.result.rows_applied for _ in engine.resolve()]
    assert len(applied) > 10 and applied == sorted(applied)
    assert 0 < applied[0] < applied[-1] == engine.result.rows_applied


def _peak_bytes(events: int, spill_events: int | None,
                retention: int | None = None) -> tuple[int, int]:
    """The peak of memory allocated while a generated log is fed and resolved (its
    lines made before), and its outcome count."""
    lines = [json.dumps(row, separators=(",", ":"))
             for row in generate(GeneratorConfig(events=events, seed=5))]
    engine = ReferenceEngine(spill_events=spill_events, dedupe_retention_ms=retention)
    tracemalloc.start()
    try:
        for line in lines:
            engine.feed(parse_line(line))
        outcomes = sum(len(resolved) for resolved, _ in engine.resolve())
        return tracemalloc.get_traced_memory()[1], outcomes
    finally:
        tracemalloc.stop()


@pytest.mark.slow
def test_a_log_sorted_on_disk_is_held_a_run_at_a_time() -> None:
    # With a dedupe retention, what the resolver keeps is bounded too.
    in_memory = [_peak_bytes(events, None, 2_000) for events in (10_000, 20_000)]
    on_disk = [_peak_bytes(events, 1_000, 2_000) for events in (10_000, 20_000)]
    assert [outcomes for _, outcomes in on_disk] == [outcomes for _, outcomes in in_memory]
    assert on_disk[1][0] < in_memory[1][0] / 5
    assert on_disk[1][0] - on_disk[0][0] < (in_memory[1][0] - in_memory[0][0]) / 10


def test_a_log_of_large_rows_spills_by_their_text_and_resolves_the_same() -> None:
    def padded(line: str) -> str:  # a malformed line stays as it is
        try:
            row = json.loads(line)
        except ValueError:
            return line
        return json.dumps({**row, "note": "x" * 10_000}) if isinstance(row, dict) else line

    lines = [padded(line) for line in random_log(2)]
    in_memory = ReferenceEngine(lateness_ms=LATENESS_MS, spill_events=None)
    in_memory.feed_lines(lines)
    on_disk = ReferenceEngine(lateness_ms=LATENESS_MS, spill_bytes=100_000)
    on_disk.feed_lines(lines)
    assert on_disk.spilled_runs >= len(lines) // 20  # about 10 rows of text a run
    assert on_disk.run() == in_memory.run()


def test_rows_held_without_their_text_are_weighed_by_their_strings() -> None:
    keys = [f"key-{i}-" + "k" * 1000 for i in range(50)]
    engine = ReferenceEngine(spill_bytes=200_000)
    for i in range(20):  # each watch holds 50 keys of about 1 KB
        engine.feed(Event(ts_ms=i, type=EventType.WATCH, raw=None, op_id=f"op-{i}",
                          keys=tuple(keys), deadline_ms=1_000,
                          condition=Condition.ANY_UPDATE))
    assert engine.spilled_runs >= 4
    assert engine.run().pending == 20


def test_rows_quarantined_on_reading_can_be_taken_as_they_come() -> None:
    engine = ReferenceEngine(lateness_ms=10)
    engine.feed_lines(['{"ts_ms": 100, "type": "tick"}', "not json",
                       '{"ts_ms": 50, "type": "tick"}'])
    taken = engine.take_quarantine()
    assert [(q.reason, q.ts_ms) for q in taken] == [(Reason.UNPARSEABLE, None),
                                                   (Reason.LATE, 50)]
    assert engine.take_quarantine() == []
    result = engine.run()
    assert result.quarantine == [] and (result.rows_in, result.rows_applied) == (3, 1)
