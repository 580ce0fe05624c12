"""Hostile input: whatever bytes or JSON values a log holds, the reference engine reads
every row, applies or quarantines each one, and its outputs can be written."""

from __future__ import annotations

import json
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tickwheel.pipeline.contract.events import compact_wire, parse_wire
from tickwheel.pipeline.engines.reference import ReferenceEngine
from tickwheel.pipeline.io.log_reader import json_lines
from tickwheel.pipeline.io.outputs import (
    outcomes_table,
    quarantine_table,
    read_parquet_rows,
    write_outcomes,
    write_quarantine,
)

_FIELDS = ["ts_ms", "type", "op_id", "keys", "deadline_ms", "condition", "targets",
           "min_total", "key", "value", "error", "schedule_id", "every_ms", "anchor_ms",
           "cron", "tz", "start_ms", "end_ms", "max_runs", "jitter_ms", "misfire",
           "grace_ms", "catchup_ms"]
_NAMES = ["watch", "update", "cancel", "tick", "all_at_least", "sum_at_least", "any_update",
          "none", "k", "j", "schedule", "unschedule", "pause", "resume", "* * * * *",
          "*/5 1-3 * jan mon", "0 0 30 2 *", "Europe/London", "UTC", "latest", "all",
          "skip"]
# Any JSON value, lone surrogates and huge numbers included, and the contract's own
# words so that some rows get far into the parser.
_SCALARS = st.one_of(
    st.none(), st.booleans(), st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=-(2**80), max_value=2**80), st.integers(-5, 5),
    st.text(max_size=6), st.sampled_from(["\ud800", "a\udfff", "\U0001f600", *_NAMES]))
_JSON = st.recursive(_SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.sampled_from(["k", "j", "\ud800"]), inner,
                                                 max_size=3)), max_leaves=6)


def _resolve(lines: list[str]) -> None:
    engine = ReferenceEngine(lateness_ms=5)
    engine.feed_lines(lines)
    result = engine.run()
    assert result.rows_in == result.rows_applied + len(result.quarantine)
    # Building the tables is where a string UTF-8 cannot hold used to fail the run.
    assert outcomes_table(result.outcomes).num_rows == len(result.outcomes)
    assert quarantine_table(result.quarantine).num_rows == len(result.quarantine)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.dictionaries(st.sampled_from(_FIELDS), _JSON), max_size=6))
def test_arbitrary_json_in_every_field_is_applied_or_quarantined(
        rows: list[dict[str, object]]) -> None:
    _resolve([json.dumps(row) for row in rows])


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=400))
def test_arbitrary_bytes_are_applied_or_quarantined(data: bytes) -> None:
    _resolve([line for chunk in json_lines(data, slice_bytes=64) for line in chunk])


def test_valid_rows_around_poison_ones_still_resolve(tmp_path: Path) -> None:
    lines = ['{"ts_ms": 1, "type": "watch", "op_id": "\\ud800", "keys": [], '
             '"deadline_ms": 5, "condition": "none"}',
             '{"ts_ms": 1, "type": "watch", "op_id": "ok", "keys": [], '
             '"deadline_ms": 5, "condition": "none"}',
             '{"ts_ms": 9, "type": "tick"}']
    engine = ReferenceEngine()
    engine.feed_lines(lines)
    result = engine.run()
    assert [o.op_id for o in result.outcomes] == ["ok"]
    assert [(q.raw, q.reason.value) for q in result.quarantine] == [(lines[0], "bad_string")]
    write_outcomes(result.outcomes, tmp_path / "outcomes")
    write_quarantine(result.quarantine, tmp_path / "quarantine")
    assert read_parquet_rows(tmp_path / "quarantine")[0]["raw"] == lines[0]


class _Pairs(list[tuple[str, object]]):
    """A JSON object as written: its names in order, repeats kept."""


_NAME = st.sampled_from(["ts_ms", "type", "op_id", "k", "a:b", ":", '"', "\\", "é", "\ud800"])
_VALUE = st.recursive(
    st.one_of(st.integers(-3, 3), st.sampled_from(["x", "a:b", '":', "\\:", "é:", "ts_ms"])),
    lambda inner: st.one_of(st.lists(inner, max_size=3),
                            st.lists(st.tuples(_NAME, inner), max_size=3).map(_Pairs)),
    max_leaves=8)


def _dump(value: object, ascii_only: bool, space: str) -> str:
    if isinstance(value, _Pairs):
        return "{" + f",{space}".join(
            f"{json.dumps(name, ensure_ascii=ascii_only)}{space}:{space}"
            f"{_dump(inner, ascii_only, space)}" for name, inner in value) + "}"
    if isinstance(value, list):
        return "[" + ",".join(_dump(inner, ascii_only, space) for inner in value) + "]"
    return json.dumps(value, ensure_ascii=ascii_only)


def _repeats(pairs: list[tuple[str, object]]) -> dict[str, object]:
    if len({name for name, _ in pairs}) != len(pairs):
        raise KeyError("repeated")
    return dict(pairs)


@settings(max_examples=400, deadline=None)
@given(st.lists(st.tuples(_NAME, _VALUE), max_size=5).map(_Pairs), st.booleans(),
       st.sampled_from(["", " ", "\t", "\n "]))
def test_a_name_given_twice_anywhere_in_a_row_quarantines_it(
        row: _Pairs, ascii_only: bool, space: str) -> None:
    line = _dump(row, ascii_only, space)
    try:
        json.loads(line, object_pairs_hook=_repeats)
        repeated = False
    except KeyError:
        repeated = True
    assert (parse_wire(line)[1] == "duplicate_field") == repeated
    assert (compact_wire(line)[1] == "duplicate_field") == repeated


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=12))
def test_a_checkpoint_names_nothing_outside_its_input_directory(name: str) -> None:
    from tickwheel.pipeline.state.local_checkpoint import file_names

    root = Path("/input/dir")
    try:
        file_names([name])
    except ValueError:
        return
    # Accepted: the name is one entry directly inside the directory.
    assert (root / name).parent == root and (root / name).name == name


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(st.lists(st.integers(min_value=-(2**63), max_value=2**63 - 1), min_size=1, max_size=8))
def test_no_ts_ms_moves_a_wall_clock_service_past_its_future_bound(
        tmp_path_factory: object, stamps: list[int]) -> None:
    from tickwheel.pipeline.engines.follow import LocalFollowEngine

    base = tmp_path_factory.mktemp("future")  # type: ignore[attr-defined]
    (base / "in").mkdir()
    lines = [json.dumps({"ts_ms": ts, "type": "watch", "op_id": f"op-{i}", "keys": ["k"],
                         "deadline_ms": 10**18, "condition": "any_update"})
             for i, ts in enumerate(stamps)]
    (base / "in" / "a.jsonl").write_text("".join(f"{line}\n" for line in lines))
    with LocalFollowEngine(base / "in", base / "out", lateness_ms=0, clock=lambda: 10_000,
                           max_future_ms=1_000) as follower:
        batch = follower.step()
        counts = follower.counts()
    assert batch is not None and batch.rows == len(stamps)
    assert counts.rows_applied + counts.quarantined + counts.held == len(stamps)
    assert counts.release_ms is None or counts.release_ms <= 11_000
    assert counts.by_reason.get("future", 0) == sum(ts > 11_000 for ts in stamps)
