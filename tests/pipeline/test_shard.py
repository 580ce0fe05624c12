"""Shards behind a watermark, without Spark: what the Spark engine does per
micro-batch, played by hand."""

from __future__ import annotations

import json
import marshal
import pickle
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.pipeline.logs import LATENESS_MS, random_log
from tickwheel.pipeline.events import Reason, canonical_line, compact_wire, parse_wire
from tickwheel.pipeline.reference import ReferenceEngine
from tickwheel.pipeline.shard import NO_ROWS, Shard, pack


def play(lines: list[str], shards: int, batch_rows: int, lateness_ms: int | None = None,
         dedupe_retention_ms: int | None = None) -> tuple[list[Shard], list, list]:
    """Micro-batches of `batch_rows` rows; the watermark moves after each, as Spark's
    does; at the end a marker moves it just past the last row."""
    state = [Shard(s, lateness_ms, dedupe_retention_ms) for s in range(shards)]
    outcomes: list = []
    quarantine: list = []
    watermark = 0
    for start in range(0, len(lines), batch_rows):
        top = None
        for shard_id, _, chunk_top, own, shared in pack(lines[start:start + batch_rows], shards):
            quarantine += state[shard_id].take(own, shared, watermark)
            if chunk_top is not None and (top is None or chunk_top > top):
                top = chunk_top
        for i, shard in enumerate(state):
            done, dups = shard.release(watermark)
            outcomes += done
            quarantine += dups
            state[i] = Shard.restore(pickle.loads(pickle.dumps(shard.snapshot())))
        if top is not None:
            watermark = max(watermark, top - LATENESS_MS)
    end = max(s.max_ts for s in state if s.max_ts is not None) + 1
    for shard in state:
        done, dups = shard.release(end)
        outcomes += done
        quarantine += dups
    return state, outcomes, quarantine


@pytest.mark.parametrize(("seed", "shards", "batch_rows"), [(1, 1, 100), (2, 3, 250),
                                                            (3, 4, 37)])
@pytest.mark.parametrize("early", [False, True], ids=["at-watermark", "early-release"])
def test_shards_behind_a_watermark_resolve_as_the_reference_engine(
        seed: int, shards: int, batch_rows: int, early: bool) -> None:
    lines = random_log(seed)
    reference = ReferenceEngine(lateness_ms=LATENESS_MS)
    reference.feed_lines(lines)
    expected = reference.run()

    state, outcomes, quarantine = play(lines, shards, batch_rows,
                                       LATENESS_MS if early else None)

    assert sorted(outcomes, key=repr) == sorted(expected.outcomes, key=repr)
    assert sorted(map(repr, quarantine)) == sorted(map(repr, expected.quarantine))
    assert sum(s.rows_in for s in state) == len(lines)
    assert sum(s.rows_applied for s in state) == expected.rows_applied
    assert sum(len(s.resolver.pending) for s in state) == expected.pending
    by_reason: dict[str, int] = {}
    by_outcome: dict[str, int] = {}
    for shard in state:
        for reason, n in shard.quarantined_by_reason.items():
            by_reason[reason] = by_reason.get(reason, 0) + n
        for outcome, n in shard.outcomes_by_outcome.items():
            by_outcome[outcome] = by_outcome.get(outcome, 0) + n
    assert by_reason == expected.quarantined_by_reason()
    assert by_outcome == expected.outcomes_by_outcome()


@pytest.mark.parametrize(("seed", "shards"), [(4, 2), (5, 3)])
def test_shards_with_a_dedupe_retention_resolve_as_the_reference_engine(
        seed: int, shards: int) -> None:
    lines = random_log(seed)
    expected = []
    for retention in (None, 300):
        reference = ReferenceEngine(lateness_ms=LATENESS_MS, dedupe_retention_ms=retention)
        reference.feed_lines(lines)
        expected.append(reference.run())
    forever, bounded = expected
    # The retention matters in this log: some reused ids start new operations.
    assert len(bounded.outcomes) > len(forever.outcomes)

    state, outcomes, quarantine = play(lines, shards, 200, LATENESS_MS, 300)

    assert sorted(outcomes, key=repr) == sorted(bounded.outcomes, key=repr)
    assert sorted(map(repr, quarantine)) == sorted(map(repr, bounded.quarantine))
    assert sum(len(s.resolver.pending) for s in state) == bounded.pending


def test_a_row_below_the_watermark_is_late_and_counted_once_across_shards() -> None:
    shards = [Shard(0), Shard(1)]
    line = '{"ts_ms": 5, "type": "update", "key": "k", "value": 1}'
    late = []
    for shard_id, _, _, own, shared in pack([line], 2):
        late += shards[shard_id].take(own, shared, watermark_ms=100)
    assert [(q.reason, q.ts_ms) for q in late] == [(Reason.LATE, 5)]
    assert sum(s.rows_in for s in shards) == 1
    assert sum(s.quarantined for s in shards) == 1


def test_the_next_timer_is_just_past_the_earliest_held_row_or_deadline() -> None:
    shard = Shard(0)
    watch = ('{"ts_ms": 50, "type": "watch", "op_id": "a", "keys": [], "deadline_ms": 70,'
             ' "condition": "none"}')
    (_, _, _, own, shared), = pack([watch], 1)
    shard.take(own, shared, watermark_ms=10)
    assert shard.next_timer_ms() == 51
    shard.release(51)  # applies the watch; its deadline is next
    assert shard.next_timer_ms() == 71
    outcomes, _ = shard.release(71)
    assert [(o.op_id, o.outcome.value, o.resolved_ms) for o in outcomes] == [("a", "expired", 70)]
    assert shard.next_timer_ms() is None


def test_early_release_applies_rows_older_than_the_bound_before_the_watermark_moves(
) -> None:
    shard = Shard(0, lateness_ms=100)
    rows = [f'{{"ts_ms": {ts}, "type": "update", "key": "k", "value": {ts}}}'
            for ts in (1_000, 1_050, 1_200)]
    (_, _, _, own, shared), = pack(rows, 1)
    shard.take(own, shared, watermark_ms=0)
    shard.release(0)  # Spark has no watermark yet
    assert shard.resolver.now == 1_099  # rows below 1_200 - 100 are applied
    assert [fields[0] for fields in shard.held] == [1_200]
    # Time has passed 1_050: a row that old is late even if the watermark lags.
    (_, _, _, own, shared), = pack(['{"ts_ms": 1050, "type": "update", "key": "k", '
                                 '"value": 1}'], 1)
    late = shard.take(own, shared, watermark_ms=0)
    assert [(q.reason, q.ts_ms) for q in late] == [(Reason.LATE, 1_050)]


def test_held_rows_count_once_across_shards_and_survive_an_older_snapshot() -> None:
    """A shared row (an update) is held by every shard and counted by shard 0 only. A
    version-2 snapshot, which kept each held row with that flag, restores the same."""
    rows = ['{"ts_ms": 10, "type": "update", "key": "k", "value": 1}',
            *(f'{{"ts_ms": 11, "type": "watch", "op_id": "op-{i}", "keys": [], '
              f'"deadline_ms": 90, "condition": "none"}}' for i in range(6))]
    shards = [Shard(0), Shard(1)]
    for shard_id, _, _, own, shared in pack(rows, 2):
        shards[shard_id].take(own, shared, watermark_ms=0)
    held = [s.status(0).held for s in shards]
    assert sum(held) == 7 and len(shards[1].held) > held[1]  # it holds the shared update
    for shard in shards:
        snapshot = list(shard.snapshot())
        assert snapshot[0] == 4
        snapshot[0] = 2
        snapshot[4] = marshal.dumps([(f, shard.shard == 0 or f[3] is not None)
                                     for f in marshal.loads(snapshot[4])])
        del snapshot[-1]  # the input's top came with version 4
        old = Shard.restore(tuple(snapshot))
        assert old.held == shard.held
        assert old.status(0).held == shard.status(0).held
        assert old.release(100)[0] == shard.release(100)[0]
        assert old.rows_applied == shard.rows_applied


def test_a_chunk_carries_its_oldest_row_and_the_newest_row_of_its_slice() -> None:
    rows = ['{"ts_ms": 30, "type": "update", "key": "k", "value": 1}',
            '{"ts_ms": 50, "type": "watch", "op_id": "op-4", "keys": [], "deadline_ms": 90,'
            ' "condition": "none"}',  # shard 1's
            '{"ts_ms": 20, "type": "watch", "op_id": "op-0", "keys": [], "deadline_ms": 90,'
            ' "condition": "none"}',  # shard 0's
            '{"ts_ms": 5, "type": "bogus"}',  # malformed: bounds nothing
            '{"ts_ms": 40, "type": "tick"}']
    assert sorted((shard, low, top) for shard, low, top, _, _ in pack(rows, 2)) == [
        (0, 20, 50), (1, 30, 50)]
    # Every shard gets a chunk, with its own rows or not.
    assert sorted((shard, low, top) for shard, low, top, _, _ in pack(rows[1:2], 2)) == [
        (0, NO_ROWS, 50), (1, 50, 50)]
    (_, low, top, _, _), = pack(['not json'], 1)
    assert (low, top) == (NO_ROWS, None)


def play_in_steps(lines: list[str], shards: int, files: int,
                  interleaved: bool = False) -> tuple[list, list, int]:
    """One micro-batch of `files` slices of the log (consecutive rows, or every
    `files`-th row, so that each spans the whole log), taken oldest chunk first with a
    release capped at the next chunk's oldest row after each, as the Spark engine's
    shards do; returns the outcomes, the quarantined rows and the most rows any shard
    held at once."""
    state = [Shard(s, LATENESS_MS) for s in range(shards)]
    per_file = -(-len(lines) // files)
    slices = ([lines[i::files] for i in range(files)] if interleaved
              else [lines[start:start + per_file] for start in range(0, len(lines), per_file)])
    chunks = sorted((chunk for part in slices for chunk in pack(part, shards)),
                    key=lambda chunk: chunk[1])
    outcomes: list = []
    quarantine: list = []
    most_held = 0
    for shard in state:
        mine = [chunk for chunk in chunks if chunk[0] == shard.shard]
        for i, (_, _, _, own, shared) in enumerate(mine):
            quarantine += shard.take(own, shared, 0)
            most_held = max(most_held, len(shard.held))
            if i + 1 < len(mine):
                done, dups = shard.release(0, below_ms=mine[i + 1][1])
                outcomes += done
                quarantine += dups
        end = max(s.max_ts for s in state if s.max_ts is not None) + 1
        done, dups = shard.release(end)
        outcomes += done
        quarantine += dups
    return outcomes, quarantine, most_held


@pytest.mark.parametrize(("seed", "shards"), [(6, 1), (7, 2), (8, 3)])
@pytest.mark.parametrize("interleaved", [False, True], ids=["consecutive", "interleaved"])
def test_a_batch_released_chunk_by_chunk_resolves_as_the_reference_engine(
        seed: int, shards: int, interleaved: bool) -> None:
    lines = random_log(seed)
    reference = ReferenceEngine(lateness_ms=LATENESS_MS)
    reference.feed_lines(lines)
    expected = reference.run()

    outcomes, quarantine, most_held = play_in_steps(lines, shards, 8, interleaved)

    assert sorted(outcomes, key=repr) == sorted(expected.outcomes, key=repr)
    assert sorted(map(repr, quarantine)) == sorted(map(repr, expected.quarantine))
    if not interleaved:
        # Released as it goes: no shard ever held the whole batch. (Slices that each
        # span the whole log can only be released together, at the end.)
        assert most_held < len(lines) // 2


def test_a_capped_release_applies_nothing_at_or_after_the_cap() -> None:
    shard = Shard(0, lateness_ms=100)
    rows = [f'{{"ts_ms": {ts}, "type": "update", "key": "k", "value": {ts}}}'
            for ts in (1_000, 1_050, 1_500)]
    (_, _, _, own, shared), = pack(rows, 1)
    shard.take(own, shared, watermark_ms=0)
    shard.release(0, below_ms=1_050)  # uncapped, it would apply up to 1_400
    assert shard.resolver.now == 1_049
    assert [fields[0] for fields in shard.held] == [1_050, 1_500]
    # A row at the cap, still to come in this batch, is not late.
    (_, _, _, own, shared), = pack(['{"ts_ms": 1050, "type": "tick"}'], 1)
    assert shard.take(own, shared, watermark_ms=0) == []


def test_a_shard_rejects_a_negative_lateness() -> None:
    with pytest.raises(ValueError, match="lateness_ms"):
        Shard(0, lateness_ms=-1)


# -- the wire form: a row's text travels only when it cannot be rebuilt ----------------

COMPACT = [
    '{"ts_ms":7,"type":"update","key":"t-0","value":125}',
    '{"ts_ms":7,"type":"update","key":"t-1","error":"NOT_LEADER"}',
    '{"ts_ms":7,"type":"watch","op_id":"p-1","keys":["t-0","t-1"],"deadline_ms":9,'
    '"condition":"all_at_least","targets":{"t-1":88,"t-0":120}}',
    '{"ts_ms":7,"type":"watch","op_id":"f-1","keys":["t-0"],"deadline_ms":9,'
    '"condition":"sum_at_least","targets":{"t-0":100},"min_total":5}',
    '{"ts_ms":7,"type":"watch","op_id":"s-1","keys":["g1/m3"],"deadline_ms":9,'
    '"condition":"any_update"}',
    '{"ts_ms":7,"type":"watch","op_id":"task-9","keys":[],"deadline_ms":-3,'
    '"condition":"none"}',
    '{"ts_ms":7,"type":"cancel","op_id":"task-9"}',
    '{"ts_ms":-7,"type":"tick"}',
]


@pytest.mark.parametrize("line", COMPACT)
def test_a_row_in_the_contracts_compact_form_travels_without_its_text(line: str) -> None:
    fields = compact_wire(line)
    assert fields[2] is None
    assert fields[:2] + fields[3:] == parse_wire(line)[:2] + parse_wire(line)[3:]
    assert canonical_line(fields) == line


@pytest.mark.parametrize("line", [
    '{"ts_ms": 7, "type": "update", "key": "t-0", "value": 125}',  # spaces
    '{"type":"update","ts_ms":7,"key":"t-0","value":125}',  # another field order
    '{"ts_ms":7,"type":"update","key":"t-0","value":125,"note":"x"}',  # unknown field
    '{"ts_ms":7,"type":"update","key":"t-\u00e9","value":125}',  # an escape
    '{"ts_ms":7,"type":"update","key":"t-é","value":125}',  # not ASCII
    '{"ts_ms":7,"type":"update","key":"t-0","value":125} ',  # trailing space
    # any_update ignores targets, so the parsed row cannot give them back
    '{"ts_ms":7,"type":"watch","op_id":"s-1","keys":["k"],"deadline_ms":9,'
    '"condition":"any_update","targets":{"k":1}}',
    '{"ts_ms":7,"type":"watch","op_id":"p-1","keys":["k"],"deadline_ms":9,'
    '"condition":"all_at_least","targets":{"k":1},"min_total":3}',
])
def test_any_other_row_keeps_its_text(line: str) -> None:
    fields = compact_wire(line)
    assert fields == parse_wire(line)
    assert fields[2] == line


def test_a_malformed_row_keeps_its_text() -> None:
    line = '{"ts_ms":7,"type":"launch"}'
    assert compact_wire(line) == (line, Reason.UNKNOWN_TYPE.value, 7)


def test_late_and_duplicate_rows_quarantine_the_line_as_read() -> None:
    compact = '{"ts_ms":5,"type":"update","key":"k","value":1}'
    spaced = '{"ts_ms": 6, "type": "update", "key": "k", "value": 1}'
    watch = ('{"ts_ms":200,"type":"watch","op_id":"w","keys":["k"],"deadline_ms":900,'
             '"condition":"any_update"}')
    shard = Shard(0)
    quarantine = []
    for _, _, _, own, shared in pack([compact, spaced, watch, watch], 1):
        quarantine += shard.take(own, shared, watermark_ms=100)
    quarantine += shard.release(1_000)[1]
    assert sorted((q.reason.value, q.raw) for q in quarantine) == sorted([
        ("late", compact), ("late", spaced), ("duplicate_op_id", watch),
        ("duplicate_op_id", watch)])


_TEXT = st.text(max_size=4)
_LONG = st.integers(min_value=-(2**63), max_value=2**63 - 1)


@st.composite
def _rows(draw: st.DrawFn) -> dict[str, Any]:
    """Well-formed rows in the contract's field order, with any strings."""
    kind = draw(st.sampled_from(["watch", "update", "cancel", "tick"]))
    row: dict[str, Any] = {"ts_ms": draw(_LONG), "type": kind}
    if kind == "update":
        row["key"] = draw(_TEXT)
        if draw(st.booleans()):
            row["value"] = draw(_LONG)
        else:
            row["error"] = draw(_TEXT)
    elif kind == "cancel":
        row["op_id"] = draw(_TEXT)
    elif kind == "watch":
        condition = draw(st.sampled_from(["all_at_least", "sum_at_least", "any_update",
                                          "none"]))
        keys = [] if condition == "none" else draw(st.lists(_TEXT, min_size=1, max_size=3,
                                                            unique=True))
        row.update(op_id=draw(_TEXT), keys=keys,
                   deadline_ms=row["ts_ms"] + draw(st.integers(-5, 5)), condition=condition)
        if condition in ("all_at_least", "sum_at_least"):
            row["targets"] = {key: draw(_LONG) for key in draw(st.permutations(keys))}
        if condition == "sum_at_least":
            row["min_total"] = draw(st.integers(1, 2**63 - 1))
    return row


@settings(max_examples=300, deadline=None)
@given(_rows(), st.booleans(), st.booleans())
def test_a_row_travels_without_its_text_only_when_it_can_be_rebuilt_exactly(
        row: dict[str, Any], compact: bool, ascii_only: bool) -> None:
    line = json.dumps(row, separators=(",", ":") if compact else None, ensure_ascii=ascii_only)
    fields, parsed = compact_wire(line), parse_wire(line)
    if len(parsed) == 3:  # malformed after all (a deadline past a long): as parsed
        assert fields == parsed
        return
    assert fields[:2] + fields[3:] == parsed[:2] + parsed[3:]
    if fields[2] is None:
        assert canonical_line(fields) == line
    else:
        assert fields[2] == line
    # Nothing needed an escape: the compact form is left out, whatever the strings.
    assert (fields[2] is None) == (compact and line.isascii() and "\\" not in line)


def test_every_shard_ends_the_input_just_past_its_latest_row() -> None:
    # The latest row is shard 1's alone; shard 0 learns it from its chunk's top.
    rows = ['{"ts_ms":100,"type":"watch","op_id":"op-0","keys":[],"deadline_ms":500,'
            '"condition":"none"}',
            '{"ts_ms":1000,"type":"watch","op_id":"op-4","keys":[],"deadline_ms":9000,'
            '"condition":"none"}']
    shards = [Shard(0), Shard(1)]
    chunks = pack(rows, 2)
    assert sorted((shard, top) for shard, _, top, _, _ in chunks) == [(0, 1000), (1, 1000)]
    for shard_id, _, top, own, shared in chunks:
        shards[shard_id].take(own, shared, watermark_ms=0, top_ms=top)
    assert [s.end_of_input_ms() for s in shards] == [1001, 1001]
    assert [s.max_ts for s in shards] == [100, 1000]
    restored = Shard.restore(pickle.loads(pickle.dumps(shards[0].snapshot())))
    assert restored.end_of_input_ms() == 1001
    outcomes, _ = shards[0].release(1001)
    assert [(o.op_id, o.outcome.value, o.resolved_ms) for o in outcomes] == [
        ("op-0", "expired", 500)]
