"""Recurring schedules in the event log: ``schedule``, ``unschedule``, ``pause`` and
``resume`` rows, each occurrence one ``fired`` outcome, misfires decided by policy, on
both engines and across restarts."""

from __future__ import annotations

import itertools
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from tests.pipeline.logs import random_log
from tests.pipeline.test_follow import WallClock, engine, land, rows
from tickwheel import Schedule
from tickwheel.pipeline.contract.events import (
    OutcomeKind,
    Quarantined,
    compact_wire,
    parse_line,
    parse_wire,
)
from tickwheel.pipeline.contract.outcomes import OutcomeRow
from tickwheel.pipeline.engines import follow
from tickwheel.pipeline.engines.partitioned import run_partitioned
from tickwheel.pipeline.engines.reference import ReferenceEngine, RunResult
from tickwheel.pipeline.io.outputs import write_outcomes
from tickwheel.pipeline.semantics.op_stage import OpStage, op_order
from tickwheel.pipeline.semantics.partition import OpHead, OpPartition
from tickwheel.pipeline.semantics.resolver import Resolver
from tickwheel.pipeline.semantics.row_times import GAP_MS, runs_of
from tickwheel.pipeline.semantics.schedule_book import SCHEDULE_KEY
from tickwheel.pipeline.state.heads import decode_op_head, encode_head
from tickwheel.pipeline.tools.generator import GeneratorConfig, generate
from tickwheel.pipeline.tools.report import kind_of, summarize
from tickwheel.service.webhook import outcomes_body


def line(ts: int, kind: str, schedule_id: str = "s", **spec: Any) -> str:
    return json.dumps({"ts_ms": ts, "type": kind, "schedule_id": schedule_id, **spec},
                      separators=(",", ":"))


def tick(ts: int) -> str:
    return json.dumps({"ts_ms": ts, "type": "tick"})


def run(lines: list[str]) -> RunResult:
    engine = ReferenceEngine(lateness_ms=0)
    engine.feed_lines(lines)
    return engine.run()


def fired(result: RunResult | list[OutcomeRow]) -> list[tuple[str, int, int]]:
    """(op_id, resolved_ms, skipped) of the fired rows, in time order."""
    outcomes = result.outcomes if isinstance(result, RunResult) else result
    return sorted(((o.op_id, o.resolved_ms, o.skipped) for o in outcomes
                   if o.outcome.value == "fired"), key=lambda row: (row[1], row[0]))


def saved(part: OpPartition) -> OpHead:
    """The partition's head as the engines save it and read it back."""
    return decode_op_head(encode_head(part.head()))


def ms(text: str) -> int:
    return int(datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp() * 1000)


# -- the rows ---------------------------------------------------------------------------


def test_a_schedule_row_in_the_compact_form_travels_without_its_text() -> None:
    compact = line(5, "schedule", cron="*/5 * * * *", tz="Asia/Kolkata", jitter_ms=300)
    fields = compact_wire(compact)
    assert fields[:4] == (5, "schedule", None, "s")
    assert dict(fields[7]) == {"cron": "*/5 * * * *", "tz": "Asia/Kolkata", "jitter_ms": 300}
    spaced = json.dumps({"ts_ms": 5, "type": "pause", "schedule_id": "s"})
    assert compact_wire(spaced)[2] == spaced  # not the canonical form: the text is kept


@pytest.mark.parametrize(("row", "reason"), [
    ({"cron": "0 0 30 2 *"}, "bad_schedule"),  # never fires
    ({"cron": "* * * * *", "tz": "Mars/Olympus"}, "bad_schedule"),
    ({"every_ms": 1.5}, "bad_schedule"),
    ({"every_ms": 0}, "bad_schedule"),
    ({"every_ms": 10, "cron": "* * * * *"}, "bad_schedule"),
    ({}, "bad_schedule"),  # neither kind
    ({"every_ms": 10, "misfire": "sometimes"}, "bad_schedule"),
    ({"cron": "* * * * * \ud800"}, "bad_string"),
])
def test_a_malformed_schedule_is_quarantined_with_a_reason_of_its_own(
        row: dict[str, Any], reason: str) -> None:
    parsed = parse_line(json.dumps({"ts_ms": 7, "type": "schedule", "schedule_id": "s", **row}))
    assert isinstance(parsed, Quarantined)
    assert (parsed.reason.value, parsed.ts_ms) == (reason, 7)


@pytest.mark.parametrize(("row", "reason"), [
    ({"ts_ms": 1, "type": "pause"}, "missing_field"),
    ({"ts_ms": 1, "type": "resume", "schedule_id": 4}, "bad_type"),
    ({"ts_ms": 1, "type": "unschedule", "schedule_id": "\ud800"}, "bad_string"),
])
def test_a_row_naming_no_schedule_is_quarantined(row: dict[str, Any], reason: str) -> None:
    parsed = parse_line(json.dumps(row))
    assert isinstance(parsed, Quarantined) and parsed.reason.value == reason


def test_a_bad_schedule_never_stops_the_rows_around_it() -> None:
    result = run([line(0, "schedule", "bad", cron="61 * * * *"),
                  line(0, "schedule", "good", every_ms=100), tick(250)])
    assert fired(result) == [("good@100", 100, 0), ("good@200", 200, 0)]
    assert [q.reason.value for q in result.quarantine] == ["bad_schedule"]
    assert result.rows_in == result.rows_applied + len(result.quarantine)


# -- occurrences ------------------------------------------------------------------------


def test_each_occurrence_fires_once_with_a_stable_id_and_its_own_time() -> None:
    result = run([line(0, "schedule", every_ms=1_000), tick(5_500)])
    assert fired(result) == [(f"s@{t}", t, 0) for t in range(1_000, 6_000, 1_000)]
    assert all(o.latency_ms == 0 and o.keys == () and o.error is None
               for o in result.outcomes)
    assert result.schedules == 1  # still held: the series goes on


def test_a_series_starts_after_its_row_and_a_row_acts_after_what_fired_at_its_time() -> None:
    # Occurrences at or before a row's ts_ms fire before it applies, as deadlines expire.
    result = run([line(1_000, "schedule", every_ms=1_000), line(3_000, "unschedule"),
                  tick(9_000)])
    assert fired(result) == [("s@2000", 2_000, 0), ("s@3000", 3_000, 0)]
    assert result.schedules == 0


def test_a_schedule_row_for_a_known_id_replaces_its_spec_from_its_time_on() -> None:
    result = run([line(0, "schedule", every_ms=1_000), line(2_500, "schedule", every_ms=300),
                  tick(3_200)])
    assert [row[0] for row in fired(result)] == ["s@1000", "s@2000", "s@2700", "s@3000"]


def test_a_cron_schedule_fires_in_its_zone_through_the_spring_forward_gap() -> None:
    # 02:30 does not exist in New York on 2026-03-08: that day fires at 03:00 EDT. The
    # log's clock is a tick every minute.
    start = ms("2026-03-07T00:00:00")
    result = run([line(start, "schedule", cron="30 2 * * *", tz="America/New_York"),
                  *(tick(t) for t in range(start, ms("2026-03-10T00:00:00") + 1, 60_000))])
    assert [row[1] for row in fired(result)] == [
        ms("2026-03-07T07:30:00"), ms("2026-03-08T07:00:00"), ms("2026-03-09T06:30:00")]


def test_a_repeated_local_hour_fires_once_at_its_first_pass() -> None:
    start = ms("2026-11-01T00:00:00")
    result = run([line(start, "schedule", cron="30 1 * * *", tz="America/New_York"),
                  tick(ms("2026-11-02T00:00:00"))])
    assert [row[1] for row in fired(result)] == [ms("2026-11-01T05:30:00")]  # 01:30 EDT


def test_a_frequent_schedule_fires_in_both_passes_of_a_repeated_hour() -> None:
    start = ms("2026-11-01T04:00:00")  # 00:00 EDT
    result = run([line(start, "schedule", "q", cron="*/30 * * * *", tz="America/New_York"),
                  line(start, "schedule", "h", cron="0 * * * *", tz="America/New_York"),
                  *(tick(t) for t in range(start, ms("2026-11-01T08:00:00") + 1, 60_000))])
    times = [row[1] for row in fired(result) if row[0].startswith("q@")]
    # After the rows' time: from 00:30 EDT, 01:00 and 01:30 twice, to 03:00 EST.
    halves = [ms(f"2026-11-01T{h:02d}:{m:02d}:00") for h in range(4, 9) for m in (0, 30)]
    assert times == halves[1:-1]
    assert [row[1] for row in fired(result) if row[0].startswith("h@")] == [
        ms(f"2026-11-01T{h:02d}:00:00") for h in range(5, 9)]  # 01 EDT, 01 EST, 02, 03


def test_jitter_delays_each_fire_the_same_way_every_run_and_never_early() -> None:
    lines = [line(0, "schedule", "j", every_ms=1_000, jitter_ms=400), tick(20_000)]
    first, again = fired(run(lines)), fired(run(lines))
    assert first == again
    spec = Schedule(every_ms=1_000, jitter_ms=400)
    for op_id, resolved, _ in first:
        occurrence = int(op_id.split("@")[1])
        assert resolved == spec.fire_ms("j", occurrence)
        assert occurrence <= resolved < occurrence + 400
    assert len({resolved - int(op_id.split("@")[1]) for op_id, resolved, _ in first}) > 5


def test_max_runs_and_end_ms_end_the_series() -> None:
    result = run([line(0, "schedule", "runs", every_ms=100, max_runs=3),
                  line(0, "schedule", "ends", every_ms=100, end_ms=250), tick(2_000)])
    assert [row[0] for row in fired(result)] == [
        "ends@100", "runs@100", "ends@200", "runs@200", "runs@300"]
    assert result.schedules == 0


@pytest.mark.parametrize(("misfire", "expected"), [
    # Paused from 500 to 10,500 with a grace of 1 s: 10,000 is on time, 1,000 to 9,000
    # were missed.
    ("latest", [("s@10000", 10_000, 9)]),
    ("all", [("s@8000", 8_000, 7), ("s@9000", 9_000, 0), ("s@10000", 10_000, 0)]),
    ("skip", [("s@10000", 10_000, 9)]),
])
def test_a_resume_decides_the_occurrences_of_the_pause_by_its_misfire_policy(
        misfire: str, expected: list[tuple[str, int, int]]) -> None:
    result = run([line(0, "schedule", every_ms=1_000, grace_ms=1_000, catchup_ms=3_000,
                       misfire=misfire),
                  line(500, "pause"), line(10_500, "resume"), tick(11_000)])
    assert fired(result) == [*expected, ("s@11000", 11_000, 0)]
    assert result.skipped == sum(row[2] for row in expected)


def test_latest_fires_the_last_missed_occurrence_when_none_on_time_follows() -> None:
    result = run([line(0, "schedule", every_ms=1_000, grace_ms=100),
                  line(500, "pause"), line(10_500, "resume"), tick(10_600)])
    assert fired(result) == [("s@10000", 10_000, 9)]


# -- misfires in event time: the log is the clock -------------------------------------


def ticks(start: int, end: int, every: int = 500) -> list[str]:
    return [tick(t) for t in range(start, end + 1, every)]


@pytest.mark.parametrize(("misfire", "expected"), [
    # Ticks every 0.5 s to 2,000, then none until 10,500: with a grace of 1 s, 3,000 to
    # 9,000 are noticed late, at 10,500; 10,000 is on time.
    ("latest", [("s@10000", 10_000, 7)]),
    ("all", [("s@8000", 8_000, 5), ("s@9000", 9_000, 0), ("s@10000", 10_000, 0)]),
    ("skip", [("s@10000", 10_000, 7)]),
])
def test_in_event_time_a_gap_in_the_log_is_decided_by_the_misfire_policy(
        misfire: str, expected: list[tuple[str, int, int]]) -> None:
    lines = [line(0, "schedule", every_ms=1_000, grace_ms=1_000, catchup_ms=3_000,
                  misfire=misfire), *ticks(500, 2_000), *ticks(10_500, 12_000)]
    result = run(lines)
    assert fired(result) == [("s@1000", 1_000, 0), ("s@2000", 2_000, 0), *expected,
                             ("s@11000", 11_000, 0), ("s@12000", 12_000, 0)]
    assert result.skipped == sum(row[2] for row in expected)
    # Partitions that each see some of the rows decide the same.
    assert fired(run_partitioned(lines, 4).outcomes) == fired(result)


def test_latest_fires_the_last_occurrence_a_gap_missed_when_none_on_time_follows() -> None:
    result = run([line(0, "schedule", every_ms=1_000, grace_ms=400), *ticks(500, 2_000),
                  *ticks(9_500, 10_000)])
    # Noticed at 9,500: 3,000 to 8,000 are passed over, 9,000 fires, late.
    assert fired(result) == [("s@1000", 1_000, 0), ("s@2000", 2_000, 0),
                             ("s@9000", 9_000, 6), ("s@10000", 10_000, 0)]


def test_a_stretch_of_a_second_or_less_without_a_row_is_continuous_time() -> None:
    # A grace of 0: every occurrence between rows is noticed late, yet only a stretch
    # longer than GAP_MS counts as a gap.
    spec = line(0, "schedule", every_ms=100, grace_ms=0, misfire="skip")
    dense = run([spec, *ticks(GAP_MS, 3 * GAP_MS, GAP_MS)])
    assert [row[2] for row in fired(dense)] == [0] * 30
    assert dense.skipped == 0
    # Rows 1,001 ms apart: each stretch is a gap, and "skip" passes over all 30.
    sparse = run([spec, *ticks(GAP_MS + 1, 3 * GAP_MS + 3, GAP_MS + 1)])
    assert fired(sparse) == [] and sparse.skipped == 30


def test_an_occurrence_after_the_last_row_waits_for_a_row_to_notice_it() -> None:
    resolver = Resolver()
    resolver.apply([parse_line(text) for text in (  # type: ignore[misc]
        line(0, "schedule", every_ms=1_000), tick(2_500))])
    resolver.advance_to(60_000)  # time alone, without a row, notices nothing
    assert fired(resolver.drain()[0]) == [("s@1000", 1_000, 0), ("s@2000", 2_000, 0)]
    resolver.apply([parse_line(tick(61_000))])  # type: ignore[list-item]
    # Noticed at 61,000, within the default grace of 60 s from 2,000 on: all fire.
    assert [row[0] for row in fired(resolver.drain()[0])] == [
        f"s@{t}" for t in range(3_000, 62_000, 1_000)]


def test_rows_that_change_nothing_are_counted_not_outcomes() -> None:
    resolver = Resolver()
    resolver.apply([parse_line(text) for text in (  # type: ignore[misc]
        line(1, "pause", "nobody"), line(1, "schedule", every_ms=10),
        line(2, "resume"), line(3, "pause"), line(4, "pause"), line(5, "unschedule", "x"))])
    assert resolver.schedules.ignored == 4
    assert resolver.drain() == ([], [])


def test_one_schedules_rows_at_one_time_apply_in_one_order_whatever_the_file_order() -> None:
    at_once = [line(1_000, "schedule", every_ms=100), line(1_000, "pause"),
               line(1_000, "resume"), line(1_000, "schedule", every_ms=70)]
    results = {tuple(fired(run([line(0, "schedule", every_ms=300), *order, tick(1_500)])))
               for order in itertools.permutations(at_once)}
    assert len(results) == 1


@pytest.mark.slow
def test_only_the_next_occurrence_of_each_schedule_is_held() -> None:
    resolver = Resolver()
    resolver.apply([parse_line(line(0, "schedule", f"s{n}", every_ms=1 + n % 7))  # type: ignore[misc]
                    for n in range(1_000)])
    resolver.apply([parse_line(tick(5_000))])  # type: ignore[list-item]
    outcomes, _ = resolver.drain()
    assert len(outcomes) > 1_000_000 // 1_000
    assert len(resolver.schedules) == 1_000
    assert len(resolver.schedules.due) == 1_000  # one pending occurrence each


# -- engines ----------------------------------------------------------------------------


@pytest.mark.parametrize("partitions", [1, 3, 8])
def test_the_partitioned_engine_fires_what_the_reference_engine_fires(partitions: int) -> None:
    for seed in range(4):
        lines = random_log(seed)
        expected = ReferenceEngine(lateness_ms=1_000)
        expected.feed_lines(lines)
        reference = expected.run()
        got = run_partitioned(lines, partitions)
        assert fired(got.outcomes) == fired(reference)
        assert fired(reference)


def test_a_restored_op_partition_fires_as_one_that_never_stopped() -> None:
    lines = [line(0, "schedule", "a", every_ms=300, jitter_ms=200),
             line(0, "schedule", "b", cron="* * * * * *", tz="Asia/Kolkata", grace_ms=500),
             line(1_500, "pause", "b"), line(4_000, "resume", "b"), tick(7_000)]
    rows_in = sorted((compact_wire(text) for text in lines), key=op_order)

    def runs(after: int, point: int) -> list[list[int]]:
        """What stage 1 would send with ``point``: the runs of the times released."""
        return [runs_of(fields[0] for fields in rows_in if after <= fields[0] < point)]

    def uninterrupted() -> list[OutcomeRow]:
        part = OpPartition(0, 0)
        part.take(rows_in, [])
        return part.release(7_001, runs(0, 7_001))[0]

    part = OpPartition(0, 0)
    part.track_changes()
    part.take(rows_in, [])
    first, _ = part.release(2_000, runs(0, 2_000))
    changed = part.entries(part.take_changes())
    assert {op_id for op_id, _ in changed} == {SCHEDULE_KEY + "a", SCHEDULE_KEY + "b"}
    restored = OpPartition.from_state(saved(part), changed, {})
    assert isinstance(restored.stage, OpStage)
    second, _ = restored.release(7_001, runs(2_000, 7_001))
    assert fired([*first, *second]) == fired(uninterrupted())
    # In the log's gap from 4,000 to 7,000, "b" (a grace of 0.5 s) misses 5,000 and
    # 6,000: the tick at 7,000 notices them late, and 7,000 on time.
    assert [row for row in fired(uninterrupted()) if row[0].startswith("b")] == [
        ("b@1000", 1_000, 0), ("b@4000", 4_000, 2), ("b@7000", 7_000, 2)]
    # An older copy caught up with what was saved since fires nothing twice.
    copy = OpPartition.from_state(saved(part), changed, {})
    later, _ = part.release(5_000, runs(2_000, 5_000))
    assert later
    assert copy.catch_up(saved(part), dict(part.entries(part.take_changes())), {})
    assert (fired(copy.release(7_001, runs(5_000, 7_001))[0])
            == fired(part.release(7_001, runs(5_000, 7_001))[0]))


# -- follow mode on a wall clock --------------------------------------------------------


def test_on_the_wall_clock_an_outage_is_decided_by_the_misfire_policy(
        tmp_path: Path) -> None:
    clock = WallClock(1_000)
    land(tmp_path / "in", "a.jsonl", [line(1_000, "schedule", every_ms=1_000, grace_ms=1_000)])
    follower = engine(tmp_path, clock)
    for now in (1_200, 2_200, 3_200):
        clock.ms = now
        follower.step()
    clock.ms = 13_200  # ten seconds without a reading, as after a restart
    follower.step()
    assert fired(outcome_rows(tmp_path)) == [
        ("s@2000", 2_000, 0), ("s@3000", 3_000, 0), ("s@13000", 13_000, 9)]
    assert follower.counts().skipped == 9 and follower.counts().schedules == 1
    clock.ms = 5_000  # the clock steps back: time holds, nothing fires again
    follower.step()
    clock.ms = 14_200
    follower.step()
    assert [row[0] for row in fired(outcome_rows(tmp_path))][-2:] == ["s@13000", "s@14000"]
    assert len(fired(outcome_rows(tmp_path))) == 4


def test_a_restart_on_the_wall_clock_fires_each_occurrence_once(tmp_path: Path) -> None:
    clock = WallClock(1_000)
    land(tmp_path / "in", "a.jsonl", [line(1_000, "schedule", every_ms=500, misfire="all")])
    follower = engine(tmp_path, clock)
    for now in range(1_200, 4_000, 400):
        clock.ms = now
        follower.step()
    follower.close()
    follower = engine(tmp_path, clock)
    for now in range(4_000, 6_000, 300):
        clock.ms = now
        follower.step()
    ids = [row[0] for row in fired(outcome_rows(tmp_path))]
    assert ids == [f"s@{t}" for t in range(1_500, 6_000, 500)]


def outcome_rows(tmp_path: Path) -> list[OutcomeRow]:
    return [OutcomeRow(r["op_id"], OutcomeKind(r["outcome"]), r["resolved_ms"], r["latency_ms"],
                       tuple(r["keys"]), r["error"], r["skipped"])
            for r in rows(tmp_path / "out" / "outcomes")]


# -- the workload and the report --------------------------------------------------------


def test_the_generator_mixes_schedules_into_the_log_the_same_way_every_time() -> None:
    config = GeneratorConfig(events=30_000, schedules=10, seed=3)
    log = generate(config)
    assert log == generate(config)
    kinds = [row["type"] for row in log]
    assert kinds.count("schedule") == 10
    assert kinds.count("pause") >= 1 and kinds.count("resume") >= 1
    zones = {row.get("tz") for row in log if row["type"] == "schedule"}
    assert {"America/New_York", "Asia/Kolkata", "Australia/Lord_Howe"} <= zones
    plain = generate(GeneratorConfig(events=30_000, seed=3))
    assert [row for row in log if row["type"] not in _SCHEDULE_KINDS][:1_000] == [
        row for row in plain if row["type"] not in _SCHEDULE_KINDS][:1_000]
    engine = ReferenceEngine()
    engine.feed_lines([json.dumps(row) for row in log])
    result = engine.run()
    assert len(fired(result)) > 40 and not result.quarantine


_SCHEDULE_KINDS = {"schedule", "unschedule", "pause", "resume"}


def test_the_report_counts_fired_and_skipped_by_schedule_kind(tmp_path: Path) -> None:
    result = run([line(0, "schedule", "job-1", every_ms=1_000, grace_ms=100),
                  line(0, "schedule", "job-2", every_ms=2_000),
                  line(500, "pause", "job-1"), line(5_500, "resume", "job-1"), tick(6_000)])
    write_outcomes(result.outcomes, tmp_path / "outcomes")
    summary = summarize(tmp_path)
    assert summary.outcomes == {"job": {"fired": len(fired(result))}}
    assert summary.skipped == result.skipped == 4  # 1,000 to 4,000; 5,000 fires as latest
    assert kind_of("job-2@1767225600000") == "job"
    assert kind_of("nightly@x") == "nightly@x"


def _as_json(row: OutcomeRow) -> dict[str, Any]:
    """The outcome as a webhook request carries it."""
    sent: dict[str, Any] = json.loads(outcomes_body([row]))["outcomes"][0]
    return sent


def test_a_fired_row_reaches_a_webhook_with_its_occurrence_as_its_id() -> None:
    row = OutcomeRow("job-1@5000", OutcomeKind.FIRED, 5_120, 120, (), None, 3)
    assert _as_json(row)["id"] == "schedule:job-1@5000"
    assert _as_json(row)["skipped"] == 3


def test_a_watch_and_an_occurrence_of_one_name_and_time_have_different_ids() -> None:
    watched = OutcomeRow("job", OutcomeKind.EXPIRED, 5_120, 120, (), None)  # at 5,000
    fired = OutcomeRow("job@5000", OutcomeKind.FIRED, 5_120, 120, (), None)
    assert _as_json(watched)["id"] == "op:job@5000"
    assert _as_json(watched)["id"] != _as_json(fired)["id"]


@pytest.mark.parametrize("schedule_id", ["", "x@1", "@"])
def test_a_schedule_id_that_would_make_occurrence_ids_ambiguous_is_refused(
        schedule_id: str) -> None:
    for kind in ("schedule", "pause", "resume", "unschedule"):
        fields = {"every_ms": 1_000} if kind == "schedule" else {}
        row = json.dumps({"ts_ms": 0, "type": kind, "schedule_id": schedule_id, **fields})
        assert parse_wire(row)[1] == "bad_id", kind


def batch_outcomes(follower: follow.LocalFollowEngine) -> list[int]:
    """The outcomes of each batch the follower runs until it has nothing to do (at
    most 19 batches)."""
    sizes = []
    while (batch := follower.step()) is not None:
        sizes.append(batch.outcomes)
        assert len(sizes) < 20
    return sizes


def test_a_catch_up_after_an_outage_fires_in_batches_of_bounded_size(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(follow, "OCCURRENCES_PER_BATCH", 5_000)
    clock = WallClock(1_000)
    land(tmp_path / "in", "a.jsonl", [line(1_000, "schedule", f"s{n}", every_ms=1_000,
                                           misfire="all") for n in range(300)])
    follower = engine(tmp_path, clock)
    clock.ms = 1_200
    follower.step()
    clock.ms = 101_200  # a hundred seconds later: 100 occurrences of each were missed
    sizes = batch_outcomes(follower)
    assert not follower.catching_up
    assert len(sizes) >= 6 and max(sizes) <= 5_000 + 100  # a series' plan is whole
    ids = [row[0] for row in fired(outcome_rows(tmp_path))]
    assert len(ids) == len(set(ids)) == 300 * 100


def crashed_and_restarted(follower: follow.LocalFollowEngine, tmp_path: Path,
                          clock: WallClock | None,
                          monkeypatch: pytest.MonkeyPatch) -> follow.LocalFollowEngine:
    """The follower killed in its next batch, after the outputs and before the state,
    and a new one started on its checkpoint (a killed process's lock is free)."""

    def crash(*_args: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(follower, "_commit", crash)
    with pytest.raises(KeyboardInterrupt):
        follower.step()
    return engine(tmp_path, clock)


def test_a_crash_in_the_middle_of_a_catch_up_loses_and_doubles_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(follow, "OCCURRENCES_PER_BATCH", 2_000)
    clock = WallClock(1_000)
    land(tmp_path / "in", "a.jsonl", [line(1_000, "schedule", f"s{n}", every_ms=1_000,
                                           misfire="all", jitter_ms=300)
                                      for n in range(100)])
    follower = engine(tmp_path, clock)
    clock.ms = 1_200
    follower.step()
    clock.ms = 101_200
    follower.step()
    follower.step()
    again = crashed_and_restarted(follower, tmp_path, clock, monkeypatch)
    while again.step() is not None:
        pass
    ids = [row[0] for row in fired(outcome_rows(tmp_path))]
    assert len(ids) == len(set(ids)) == 100 * 100


def test_in_event_time_a_gap_is_caught_up_in_bounded_batches_and_rows_wait_their_turn(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(follow, "OCCURRENCES_PER_BATCH", 5_000)
    land(tmp_path / "in", "a.jsonl", [*(line(1_000, "schedule", f"s{n}", every_ms=1_000,
                                             misfire="all") for n in range(300)),
                                      tick(1_500)])
    follower = engine(tmp_path, None)  # event time: the log is the clock
    follower.step()
    # The log's next rows come 100 s later: 300 x 99 occurrences in the gap, and an
    # unschedule of s0 after it, which must see all of s0's fire first.
    land(tmp_path / "in", "b.jsonl", [tick(101_000), line(101_000, "unschedule", "s0"),
                                      tick(101_200)])
    sizes = batch_outcomes(follower)
    assert not follower.catching_up
    assert len(sizes) >= 6 and max(sizes) <= 5_000 + 100  # a series' plan is whole
    rows = fired(outcome_rows(tmp_path))
    ids = [row[0] for row in rows]
    assert len(ids) == len(set(ids)) == 300 * 100
    assert max(t for op_id, t, _ in rows if op_id.startswith("s0@")) == 101_000
    assert follower.counts().schedules == 299


def test_schedules_and_the_rows_past_their_gap_in_one_batch_are_caught_up_in_bounded_batches(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(follow, "OCCURRENCES_PER_BATCH", 1_000)
    land(tmp_path / "in", "a.jsonl", [*(line(1_000, "schedule", f"s{n}", every_ms=1_000,
                                             misfire="all") for n in range(60)),
                                      tick(1_500), tick(101_000), tick(101_200)])
    follower = engine(tmp_path, None)
    sizes = batch_outcomes(follower)
    assert len(fired(outcome_rows(tmp_path))) == 60 * 100
    assert len(sizes) >= 6 and max(sizes) <= 1_000 + 60


def test_in_event_time_a_crash_in_the_middle_of_a_catch_up_loses_and_doubles_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(follow, "OCCURRENCES_PER_BATCH", 2_000)
    first = [*(line(1_000, "schedule", f"s{n}", every_ms=1_000, misfire="all",
                    jitter_ms=300) for n in range(100)), tick(1_500)]
    then = [tick(101_000), tick(101_400), tick(101_600)]  # 101,400 is released
    land(tmp_path / "in", "a.jsonl", first)
    follower = engine(tmp_path, None)
    follower.step()
    land(tmp_path / "in", "b.jsonl", then)
    follower.step()
    follower.step()
    again = crashed_and_restarted(follower, tmp_path, None, monkeypatch)
    assert again.catching_up  # restored in the middle: goes on without new input
    while again.step() is not None:
        pass
    ids = [row[0] for row in fired(outcome_rows(tmp_path))]
    uninterrupted = ReferenceEngine(lateness_ms=100)  # the engine's lateness
    uninterrupted.feed_lines([*first, *then])
    assert len(ids) == len(set(ids)) == 100 * 100
    assert sorted(ids) == sorted(row[0] for row in fired(uninterrupted.run()))


def test_replaced_and_ended_schedules_leave_no_pending_occurrences_behind() -> None:
    resolver = Resolver()
    for n in range(20_000):  # one id, replaced again and again, a year out each time
        resolver.apply([parse_line(line(n, "schedule", "s", cron="0 0 1 1 *"))])  # type: ignore[list-item]
    for n in range(10_000):
        resolver.apply([parse_line(line(20_000 + n, "schedule", f"t{n}", every_ms=10**9)),  # type: ignore[list-item]
                        parse_line(line(20_000 + n, "unschedule", f"t{n}"))])
    assert len(resolver.schedules) == 1
    assert len(resolver.schedules.due) <= 2 + 4_096
    assert resolver.schedules.next_fire_ms() == ms("1971-01-01T00:00:00")


def test_a_crons_walk_over_a_long_gap_counts_against_the_limit_as_fires_do() -> None:
    resolver = Resolver()
    resolver.schedules.clock_notices = True
    # Every second, in a zone: 30,000 occurrences missed, each found by a walk.
    resolver.apply([parse_line(line(0, "schedule", cron="* * * * * *",  # type: ignore[list-item]
                                    tz="Europe/London", misfire="latest"))])
    resolver.advance_to(30_000_000, fire_limit=3_000)
    book = resolver.schedules
    assert book.behind(30_000_000) and book.skipped < 3_000 + 4_096
    calls = 1
    while book.behind(30_000_000):
        resolver.advance_to(30_000_000, fire_limit=3_000)
        calls += 1
    rows = fired(resolver.drain()[0])
    # The minute of grace fires (61 occurrences); the first of it tells of the rest.
    assert calls >= 30_000 // 4_096 and len(rows) == 61  # a plan of 4,096 at least a call
    assert rows[0] == ("s@29940000", 29_940_000, 29_939) and book.skipped == 29_939


def test_one_series_catching_up_stops_at_the_limit_and_goes_on_at_the_next_advance() -> None:
    resolver = Resolver()
    resolver.schedules.clock_notices = True
    resolver.apply([parse_line(line(0, "schedule", every_ms=1, misfire="all",  # type: ignore[list-item]
                                    catchup_ms=100_000))])
    resolver.advance_to(50_000, fire_limit=10_000)
    first, _ = resolver.drain()
    assert 10_000 <= len(first) < 10_000 + 4_096
    assert resolver.schedules.behind(50_000)
    while resolver.schedules.behind(50_000):
        resolver.advance_to(50_000, fire_limit=10_000)
    rest, _ = resolver.drain()
    ids = [o.op_id for o in [*first, *rest]]
    assert ids == [f"s@{t}" for t in range(1, 50_001)]


@pytest.mark.parametrize("spill_events", [None, 50], ids=["in-memory", "sorted-on-disk"])
def test_a_batch_run_yields_a_gaps_catch_up_in_bounded_shares(
        spill_events: int | None, monkeypatch: pytest.MonkeyPatch) -> None:
    """The reference engine decides a catch-up a share at a time, each yielded before
    the next, whether the log is in memory or merged from disk; the outcomes, and a
    row after the gap that must see every occurrence before it, equal an unbounded
    run's."""
    from tickwheel.pipeline.engines import reference

    lines = [*(line(1_000, "schedule", f"s{n}", every_ms=1_000, misfire="all")
               for n in range(60)), tick(1_500), tick(101_000),
             line(101_000, "unschedule", "s0"), tick(101_200)]
    whole = run(lines)
    monkeypatch.setattr(reference, "OCCURRENCES_PER_BATCH", 500)
    engine = ReferenceEngine(lateness_ms=0, **({} if spill_events is None
                                               else {"spill_events": spill_events}))
    engine.feed_lines(lines)
    shares = [outcomes for outcomes, _ in engine.resolve()]
    assert fired([o for share in shares for o in share]) == fired(whole)
    assert len(fired(whole)) == 60 * 100
    assert max(t for op_id, t, _ in fired(whole) if op_id.startswith("s0@")) == 101_000
    assert len([s for s in shares if s]) >= 12 and max(map(len, shares)) <= 500 + 60
    assert (engine.result.rows_applied, engine.result.schedules) == (
        whole.rows_applied, whole.schedules)


def test_apply_wire_stops_where_occurrences_before_a_row_wait_and_goes_on_from_there(
        ) -> None:
    rows = [compact_wire(text) for text in (
        *(line(1_000, "schedule", f"s{n}", every_ms=1_000, misfire="all")
          for n in range(10)),
        tick(1_500), tick(31_000), tick(31_200))]
    resolver = Resolver()
    stops, shares = [], []
    at = 0
    while at < len(rows):
        at = resolver.apply_wire(rows, at, fire_limit=100)
        stops.append(at)
        shares.append(len(resolver.drain()[0]))
    # The schedules and the first tick, then the gap's 300 occurrences in shares of
    # about 100 (the budget, and a step of each series' plan past it), then the rest.
    assert stops == [11, 11, 13]
    assert shares == [120, 120, 60]
    assert resolver.applied == len(rows)
