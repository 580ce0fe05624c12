"""The local engine in follow mode: files are read as they land, deadlines fire when
the wall clock passes them plus the lateness bound, and a restart carries on, after a
crash too, without losing or doubling an outcome. Time is a manual clock here."""

from __future__ import annotations

import base64
import gc
import json
import marshal
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from tests.conftest import eventually, wait_for
from tests.pipeline.logs import LATENESS_MS, random_log
from tickwheel.pipeline.contract.events import compact_wire
from tickwheel.pipeline.engines import follow
from tickwheel.pipeline.engines.feed import FileStat, IntakeFeed
from tickwheel.pipeline.engines.follow import LocalFollowEngine
from tickwheel.pipeline.engines.following import wall_clock_ms
from tickwheel.pipeline.engines.reference import ReferenceEngine
from tickwheel.pipeline.io.input_dir import INPUT_NAMES
from tickwheel.pipeline.semantics import partition
from tickwheel.pipeline.state import entry_log
from tickwheel.pipeline.state.encoding import LOCAL_CHECKPOINT_FORMAT


class WallClock:
    """A wall clock the test sets, backwards too (as NTP may step one)."""

    def __init__(self, ms: int) -> None:
        self.ms = ms

    def __call__(self) -> int:
        return self.ms


def land(directory: Path, name: str, lines: list[str]) -> None:
    """A file written whole, then renamed into place, as producers must."""
    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / f".{name}.tmp"
    tmp.write_text("".join(f"{text}\n" for text in lines))
    tmp.rename(directory / name)


def rows(directory: Path) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    for path in sorted(directory.glob("batch-*.parquet")):
        found.extend(pq.read_table(path).to_pylist())
    return found


def outcomes(output: Path) -> list[tuple[Any, ...]]:
    return sorted((r["op_id"], r["outcome"], r["resolved_ms"], r["latency_ms"],
                   tuple(r["keys"]), r["error"]) for r in rows(output / "outcomes"))


def outcomes_skipped(output: Path) -> list[tuple[Any, ...]]:
    """:func:`outcomes`, with each fired row's count of skipped occurrences."""
    return sorted((r["op_id"], r["outcome"], r["resolved_ms"], r["latency_ms"],
                   tuple(r["keys"]), r["error"], r["skipped"])
                  for r in rows(output / "outcomes"))


def watch(ts: int, op_id: str, deadline: int, keys: list[str] | None = None) -> str:
    return json.dumps({"ts_ms": ts, "type": "watch", "op_id": op_id,
                       "keys": keys or ["k"], "deadline_ms": deadline,
                       "condition": "any_update"})


def cancel(ts: int, op_id: str) -> str:
    return json.dumps({"ts_ms": ts, "type": "cancel", "op_id": op_id})


def seen_on_disk(directory: Path) -> list[str]:
    """The op ids in the seen ids' files, each as often as a segment holds it."""
    return [op_id for path in directory.iterdir() for line in path.read_text().splitlines()
            for record in json.loads(line)[1]
            for op_id, _ in marshal.loads(base64.b64decode(record[3]))]


def engine(tmp_path: Path, clock: Callable[[], int] | None, **options: Any) -> LocalFollowEngine:
    options.setdefault("lateness_ms", 100)
    return LocalFollowEngine(tmp_path / "in", tmp_path / "out", clock=clock, **options)


@pytest.fixture
def inbox(tmp_path: Path) -> Path:
    (tmp_path / "in").mkdir()
    return tmp_path / "in"


# -- reading as files land -----------------------------------------------------------


@pytest.mark.parametrize("seed", range(3))
def test_files_landing_one_by_one_resolve_as_the_reference_engine_resolves_the_log(
        tmp_path: Path, inbox: Path, seed: int) -> None:
    # No gaps: on the wall clock an occurrence is noticed at the clock's readings, in
    # event time at the rows' times, and only a log without gaps makes them one.
    lines = random_log(seed, gaps=False)
    clock = WallClock(0)
    follower = engine(tmp_path, clock, lateness_ms=LATENESS_MS, dedupe_retention_ms=None)
    for i in range(0, len(lines), 200):
        part = lines[i:i + 200]
        land(inbox, f"part-{i:05d}.jsonl", part)
        # The wall clock runs with the rows' own time, as a live producer's would.
        clock.ms = max(json.loads(text)["ts_ms"] for text in part if text.startswith("{")
                       and isinstance(json.loads(text).get("ts_ms"), int))
        assert follower.step() is not None
    top = max(json.loads(text)["ts_ms"] for text in lines if text.startswith('{"ts_ms":')
              and isinstance(json.loads(text)["ts_ms"], int))
    clock.ms = top + LATENESS_MS + 1  # time stands at the last row: the log has ended
    follower.step()
    reference = ReferenceEngine(lateness_ms=LATENESS_MS)
    reference.feed_lines(lines)
    expected = reference.run()
    assert outcomes_skipped(tmp_path / "out") == sorted(
        (o.op_id, o.outcome.value, o.resolved_ms, o.latency_ms, tuple(o.keys), o.error,
         o.skipped) for o in expected.outcomes)
    assert len(rows(tmp_path / "out" / "quarantine")) == len(expected.quarantine)


def test_a_file_is_read_once_however_many_batches_run(tmp_path: Path, inbox: Path) -> None:
    follower = engine(tmp_path, None)
    land(inbox, "a.jsonl", [watch(1_000, "op", 1_050)])
    first = follower.step()
    assert first is not None and (first.files, first.rows) == (1, 1)
    assert follower.step() is None  # nothing new, and time follows the rows only
    land(inbox, "b.jsonl", [watch(1_200, "later", 5_000)])
    second = follower.step()
    assert second is not None and (second.files, second.rows) == (1, 1)
    assert outcomes(tmp_path / "out") == [("op", "expired", 1_050, 50, ("k",), None)]


def test_a_file_counts_as_committed_once_its_batch_has_committed(
        tmp_path: Path, inbox: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    follower = engine(tmp_path, None)
    land(inbox, "a.jsonl", [watch(1_000, "op", 1_050)])
    asked: list[list[str]] = []
    commit = follower._commit

    def committing(*args: Any) -> None:
        asked.append(follower.committed_inputs(["a.jsonl"]))  # as it commits: not yet
        commit(*args)

    monkeypatch.setattr(follower, "_commit", committing)
    assert follower.committed_inputs(["a.jsonl", "b.jsonl"]) == []
    follower.step()
    assert asked == [[]]
    assert follower.committed_inputs(["a.jsonl", "b.jsonl"]) == ["a.jsonl"]
    (inbox / "a.jsonl").unlink()  # retired: nothing is read again or lost
    land(inbox, "b.jsonl", [watch(1_200, "later", 5_000)])
    second = follower.step()
    assert second is not None and (second.files, second.rows) == (1, 1)
    assert follower.committed_inputs(["a.jsonl", "b.jsonl"]) == ["b.jsonl"]


@pytest.mark.parametrize(("name", "why"), [
    (b"b\xff.jsonl", "its name is not valid UTF-8: rename it"),
    (b"b.jsonl.xz", f"compressed with .xz, which is not read: the engines read {INPUT_NAMES}"),
    (b"b.txt", f"not a log: the engines read {INPUT_NAMES}"),
])
def test_a_file_that_lands_unreadable_by_name_is_skipped_with_one_warning_until_renamed(
        tmp_path: Path, inbox: Path, caplog: pytest.LogCaptureFixture, name: bytes,
        why: str) -> None:
    # An undecodable name is refused before any work (a command line's input), but a
    # service that is running keeps running: the file waits, logged, until renamed.
    follower = engine(tmp_path, None)
    land(inbox, "a.jsonl", [watch(1_000, "op", 1_050)])
    follower.step()
    bad = inbox / os.fsdecode(name)
    bad.write_text(watch(1_200, "later", 5_000) + "\n")
    with caplog.at_level("WARNING", logger="tickwheel.pipeline.io.input_dir"):
        assert follower.step() is None and follower.step() is None
    assert [r.getMessage() for r in caplog.records].count(
        f"skipping input file {str(bad)!r}: {why}") == 1
    assert follower.counts().files_skipped == 1
    bad.rename(inbox / "b.jsonl")
    batch = follower.step()
    assert batch is not None and (batch.files, batch.rows) == (1, 1)
    assert follower.counts().files_skipped == 0


def test_a_gzipd_file_that_lands_is_read_as_its_lines(tmp_path: Path, inbox: Path) -> None:
    import gzip

    follower = engine(tmp_path, None)
    text = watch(1_000, "op", 1_050) + "\n" + watch(1_200, "later", 5_000) + "\n"
    (inbox / ".a.jsonl.gz.tmp").write_bytes(gzip.compress(text.encode()))
    (inbox / ".a.jsonl.gz.tmp").rename(inbox / "a.jsonl.gz")
    batch = follower.step()
    assert batch is not None and (batch.files, batch.rows) == (1, 2)
    assert outcomes(tmp_path / "out") == [("op", "expired", 1_050, 50, ("k",), None)]


def test_an_input_directory_that_goes_and_comes_back_is_waited_for_and_not_read_again(
        tmp_path: Path, inbox: Path, caplog: pytest.LogCaptureFixture) -> None:
    # A remount or a move: the service keeps its deadlines and what it has seen, and
    # reads only what is new once the directory is back.
    clock = WallClock(1_000)
    follower = engine(tmp_path, clock)
    land(inbox, "a.jsonl", [watch(1_000, "op", 1_500)])
    assert follower.step() is not None
    moved = tmp_path / "moved"
    inbox.rename(moved)
    with caplog.at_level("WARNING", logger="tickwheel.pipeline.engines.follow"):
        assert follower.step() is None and follower.step() is None
        clock.ms = 1_601  # the deadline passes while the input is gone
        batch = follower.step()
        assert batch is not None and (batch.files, batch.outcomes) == (0, 1)
        moved.rename(inbox)
        land(inbox, "b.jsonl", [watch(1_700, "later", 5_000)])
        batch = follower.step()
    assert batch is not None and (batch.files, batch.rows) == (1, 1)  # a.jsonl not again
    assert [r.getMessage() for r in caplog.records] == [
        f"input directory {inbox} does not exist: waiting for it to come back",
        f"input directory {inbox} is back"]
    assert outcomes(tmp_path / "out") == [("op", "expired", 1_500, 500, ("k",), None)]


# -- time passes without input --------------------------------------------------------


def test_an_operation_with_no_later_input_expires_once_the_wall_clock_passes_it(
        tmp_path: Path, inbox: Path) -> None:
    clock = WallClock(1_000)
    follower = engine(tmp_path, clock)
    land(inbox, "a.jsonl", [watch(1_000, "op", 1_500)])
    follower.step()
    # Held (rows may still arrive before it), and due once time passes its deadline.
    assert follower.next_wake_ms() == 1_500 + 100 + 1
    clock.ms = 1_101
    follower.step()
    # Now in the purgatory's timing wheel, in a bucket that starts before its
    # deadline: the wake is still the deadline, not the bucket.
    assert follower.next_wake_ms() == 1_500 + 100 + 1
    clock.ms = 1_600  # the deadline plus the lateness bound: rows may still arrive
    follower.step()
    assert outcomes(tmp_path / "out") == []
    clock.ms = 1_601
    batch = follower.step()
    assert batch is not None and batch.outcomes == 1 and batch.lag_ms == 100
    assert outcomes(tmp_path / "out") == [("op", "expired", 1_500, 500, ("k",), None)]
    assert follower.next_wake_ms() is None


def test_a_cancel_that_arrives_in_time_prevents_the_expiry(tmp_path: Path,
                                                           inbox: Path) -> None:
    clock = WallClock(1_000)
    follower = engine(tmp_path, clock)
    land(inbox, "a.jsonl", [watch(1_000, "op", 1_500)])
    follower.step()
    clock.ms = 1_550
    land(inbox, "b.jsonl", [cancel(1_490, "op")])  # late by 60 ms, within the bound
    follower.step()
    clock.ms = 5_000
    follower.step()
    assert outcomes(tmp_path / "out") == [("op", "cancelled", 1_490, 490, ("k",), None)]


def test_a_row_later_than_the_bound_behind_the_wall_clock_is_quarantined_as_late(
        tmp_path: Path, inbox: Path) -> None:
    clock = WallClock(10_000)
    follower = engine(tmp_path, clock)
    follower.step()
    land(inbox, "a.jsonl", [watch(9_899, "late", 20_000), watch(9_900, "on-time", 20_000)])
    follower.step()
    quarantined = rows(tmp_path / "out" / "quarantine")
    assert [(json.loads(q["raw"])["op_id"], q["reason"]) for q in quarantined] == [
        ("late", "late")]
    assert follower.counts().held == 1  # on time: held until time passes it


def test_an_intake_floor_holds_time_so_a_row_stamped_before_a_slow_batch_is_not_late(
        tmp_path: Path, inbox: Path) -> None:
    clock = WallClock(10_000)
    feed = IntakeFeed(clock)
    stamp = feed.stamper.stamp()  # a request stamped 10_000 is being written
    follower = engine(tmp_path, clock, feed=feed)
    follower.step()
    clock.ms = 12_000  # the batch, or the commit, took two seconds
    follower.step()
    assert follower.keys.release_ms == 10_000  # held at the floor, not at 11_900
    land(inbox, "a.jsonl", [watch(10_000, "stamped", 10_500)])
    feed.stamper.settle(stamp)  # landed: nothing held any more
    follower.step()
    assert rows(tmp_path / "out" / "quarantine") == []
    clock.ms = 13_000
    follower.step()
    assert outcomes(tmp_path / "out") == [("stamped", "expired", 10_500, 500, ("k",), None)]


def test_a_wall_clock_that_steps_back_never_takes_time_back(tmp_path: Path,
                                                            inbox: Path) -> None:
    clock = WallClock(1_000)
    follower = engine(tmp_path, clock)
    land(inbox, "a.jsonl", [watch(1_000, "op", 1_200)])
    follower.step()
    clock.ms = 2_000
    follower.step()
    assert len(outcomes(tmp_path / "out")) == 1
    clock.ms = 500  # an NTP step back
    assert follower.step() is None
    land(inbox, "b.jsonl", [watch(1_500, "op", 9_000), cancel(1_850, "op")])
    follower.step()  # below where time stands (1_900): late, not applied
    clock.ms = 20_000
    follower.step()
    assert outcomes(tmp_path / "out") == [("op", "expired", 1_200, 200, ("k",), None)]
    assert len(rows(tmp_path / "out" / "quarantine")) == 2


# -- restarts ---------------------------------------------------------------------------


def test_a_restart_carries_on_where_the_last_run_stopped(tmp_path: Path,
                                                         inbox: Path) -> None:
    clock = WallClock(1_000)
    follower = engine(tmp_path, clock)
    land(inbox, "a.jsonl", [watch(1_000, "a", 1_500), watch(1_000, "b", 3_000)])
    follower.step()
    clock.ms = 2_000
    follower.step()
    del follower
    again = engine(tmp_path, clock)
    assert again.ops.stage.pending.keys() == {"b"}
    assert again.step() is None  # a.jsonl was read, and time has not moved
    clock.ms = 4_000
    again.step()
    assert [o[:2] for o in outcomes(tmp_path / "out")] == [("a", "expired"),
                                                           ("b", "expired")]


def test_a_batch_cut_short_by_a_crash_runs_again_from_its_plan(
        tmp_path: Path, inbox: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    clock = WallClock(1_000)
    follower = engine(tmp_path, clock)
    land(inbox, "a.jsonl", [watch(1_000, "a", 1_500), watch(1_000, "b", 1_700)])
    follower.step()
    clock.ms = 1_650

    def crash(*_args: object) -> None:
        raise KeyboardInterrupt  # killed after the outputs, before the state

    monkeypatch.setattr(follower, "_commit", crash)
    with pytest.raises(KeyboardInterrupt):
        follower.step()
    written = outcomes(tmp_path / "out")
    assert [o[0] for o in written] == ["a"]
    # Meanwhile a row lands that would change the batch if it ran afresh, and the
    # clock moves on: the batch runs again as planned, then the next one.
    land(inbox, "b.jsonl", [cancel(1_600, "a"), cancel(1_690, "b")])
    clock.ms = 5_000
    again = engine(tmp_path, clock)
    redone = again.step()
    assert redone is not None and redone.batch_id == 1 and redone.clock_ms == 1_650
    assert outcomes(tmp_path / "out") == written
    again.step()
    assert [o[:2] for o in outcomes(tmp_path / "out")] == [("a", "expired"),
                                                           ("b", "cancelled")]


def test_a_torn_line_in_the_files_log_does_not_lose_the_next_ones(tmp_path: Path,
                                                                   inbox: Path) -> None:
    follower = engine(tmp_path, None)
    land(inbox, "a.jsonl", [watch(1_000, "a", 9_000)])
    follower.step()
    with open(tmp_path / "out" / "_checkpoint" / "files.log", "a") as log_file:
        log_file.write('[1, ["b.js')  # a crash in the middle of a later batch's line
    again = engine(tmp_path, None)
    land(inbox, "b.jsonl", [watch(1_100, "b", 9_000)])
    assert again.step() is not None
    third = engine(tmp_path, None)
    assert third.step() is None  # b.jsonl is remembered: not read twice
    assert third.counts().rows_in == 2


def test_options_the_state_depends_on_cannot_change_on_restart(tmp_path: Path,
                                                               inbox: Path) -> None:
    engine(tmp_path, None, lateness_ms=100)
    with pytest.raises(ValueError, match="lateness_ms=200 but the checkpoint"):
        engine(tmp_path, None, lateness_ms=200)
    with pytest.raises(ValueError, match="clock=wall but the checkpoint"):
        engine(tmp_path, WallClock(0), lateness_ms=100)


def test_a_spark_checkpoint_is_refused_by_name(tmp_path: Path, inbox: Path) -> None:
    checkpoint = tmp_path / "out" / "_checkpoint"
    checkpoint.mkdir(parents=True)
    (checkpoint / "tickwheel.json").write_text(json.dumps({"format": 3, "id": "x"}))
    with pytest.raises(ValueError, match="engine spark, format 3"):
        engine(tmp_path, None)


def test_a_checkpoint_of_an_earlier_local_format_is_refused_naming_both_formats(
        tmp_path: Path, inbox: Path) -> None:
    checkpoint = tmp_path / "out" / "_checkpoint"
    checkpoint.mkdir(parents=True)
    (checkpoint / "tickwheel.json").write_text(json.dumps({"engine": "local", "format": 3}))
    with pytest.raises(ValueError, match=rf"format 3; this one reads format "
                                         rf"{LOCAL_CHECKPOINT_FORMAT}\)"):
        engine(tmp_path, None)


# -- on the real clock ------------------------------------------------------------------


def test_run_fires_a_deadline_on_the_real_clock_and_stops_when_told(
        tmp_path: Path, inbox: Path) -> None:
    follower = engine(tmp_path, wall_clock_ms, lateness_ms=50)
    stop = threading.Event()
    batches: list[Any] = []
    runner = threading.Thread(target=lambda: batches.append(
        follower.follow(stop, trigger_ms=5_000)))
    runner.start()
    try:
        now = wall_clock_ms()
        land(inbox, "a.jsonl", [watch(now, "soon", now + 200)])
        # The trigger is 5 s: the file waits for it, then the timer wakes the loop at
        # the deadline rather than at the next trigger.
        eventually(lambda: bool(outcomes(tmp_path / "out")), 30)
        assert [o[:2] for o in outcomes(tmp_path / "out")] == [("soon", "expired")]
    finally:
        stop.set()
        runner.join(timeout=30)
    assert not runner.is_alive()
    assert batches[0].outcomes == 1


def test_what_outlives_a_batch_is_out_of_the_collectors_walk_until_run_returns(
        tmp_path: Path, inbox: Path) -> None:
    follower = engine(tmp_path, WallClock(1_000))
    land(inbox, "a.jsonl", [watch(1_000, "op", 1_500)])
    stop = threading.Event()
    frozen: list[int] = []

    def on_batch(batch: Any) -> None:
        frozen.append(gc.get_freeze_count())
        stop.set()

    gc.unfreeze()
    try:
        follower.follow(stop, trigger_ms=1, on_batch=on_batch)
    finally:
        gc.unfreeze()
    assert frozen and frozen[0] > 0
    assert gc.get_freeze_count() == 0  # all back once it returns


def test_a_following_engine_thaws_its_objects_every_so_often(
        tmp_path: Path, inbox: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(follow, "FOLLOW_THAW_EVERY_S", 0.0)  # a thaw after every batch
    follower = engine(tmp_path, WallClock(1_000))
    land(inbox, "a.jsonl", [watch(1_000, "op", 1_500)])
    stop = threading.Event()
    frozen: list[int] = []

    def on_batch(batch: Any) -> None:
        frozen.append(gc.get_freeze_count())
        stop.set()

    follower.follow(stop, trigger_ms=1, on_batch=on_batch)
    assert frozen == [0]


def test_the_first_batch_imports_nothing(tmp_path: Path, inbox: Path) -> None:
    """What writing outputs imports (pyarrow, and what it looks for) is imported when
    the engine is made, not in its first batch, which a submit server's requests in
    the same process would wait out. In a fresh interpreter: this one has it all."""
    land(inbox, "a.jsonl", [watch(100, "a", 200)])
    script = (
        "import sys\n"
        "from pathlib import Path\n"
        "from tickwheel.pipeline.engines.follow import LocalFollowEngine\n"
        f"engine = LocalFollowEngine(Path({str(inbox)!r}), Path({str(tmp_path / 'out')!r}),"
        " clock=lambda: 10_000, lateness_ms=100)\n"
        "before = set(sys.modules)\n"
        "batch = engine.step()\n"
        "assert batch is not None and batch.outcomes == 1, batch\n"
        "print(sorted(set(sys.modules) - before))\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


class CountingFeed(IntakeFeed):
    """A feed that counts the engine's calls to give way (and never sleeps)."""

    def __init__(self, clock: Callable[[], int]) -> None:
        super().__init__(clock)
        self.calls = 0

    def give_way(self) -> bool:
        self.calls += 1
        return False


def test_a_batch_gives_way_to_its_feed_between_pieces_in_both_stages(
        tmp_path: Path, inbox: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An intake in the same process gets its turn between the pieces of a batch's
    rows, in either stage, and the batch decides what it would without."""
    monkeypatch.setattr(partition, "PIECE_ROWS", 4)
    feed = CountingFeed(WallClock(1_000))
    follower = engine(tmp_path, WallClock(1_000), feed=feed)
    land(inbox, "a.jsonl", [watch(100 + i, f"op{i}", 500) for i in range(10)])
    batch = follower.step()
    assert batch is not None and batch.outcomes == 10  # expired at 500
    assert feed.calls >= 4  # ten rows, each in both stages, in pieces of four


def test_no_collection_walks_what_a_batch_made_once_the_collector_is_back_on(
        tmp_path: Path, inbox: Path) -> None:
    """Frozen before the collector is enabled again: else the first young collection
    after each batch walks everything the batch made, holding the interpreter's lock
    while a submit server's loop waits."""
    follower = engine(tmp_path, WallClock(1_000))
    land(inbox, "a.jsonl", [watch(1_000, "op", 1_500)])
    stop = threading.Event()
    made: list[list[int]] = []
    young_at_start: list[int] = []
    frozen: list[int] = []
    step = follower.step
    stepped = False

    def spied() -> Any:
        nonlocal stepped
        made.extend([i] for i in range(20_000))  # containers the collector tracks
        batch = step()
        stepped = True
        return batch

    def watch_collections(phase: str, info: dict[str, int]) -> None:
        if stepped and phase == "start":
            young_at_start.append(gc.get_count()[0])

    def on_batch(batch: Any) -> None:
        frozen.append(gc.get_freeze_count())
        stop.set()

    follower.step = spied  # type: ignore[method-assign]
    was = gc.isenabled()
    gc.enable()
    gc.unfreeze()
    gc.callbacks.append(watch_collections)
    try:
        follower.follow(stop, trigger_ms=1, on_batch=on_batch)
        gc.collect(0)  # one young collection at least, after the batch
    finally:
        gc.callbacks.remove(watch_collections)
        gc.unfreeze()
        (gc.enable if was else gc.disable)()
    assert frozen and frozen[0] >= len(made)
    assert young_at_start and max(young_at_start) < len(made) // 2


@pytest.mark.parametrize("enabled", [True, False])
def test_a_batch_runs_with_the_collector_paused_and_run_leaves_it_as_it_was(
        tmp_path: Path, inbox: Path, enabled: bool) -> None:
    follower = engine(tmp_path, WallClock(1_000))
    land(inbox, "a.jsonl", [watch(1_000, "op", 1_500)])
    stop = threading.Event()
    during: list[bool] = []
    step = follower.step

    def spied() -> Any:
        during.append(gc.isenabled())
        stop.set()
        return step()

    follower.step = spied  # type: ignore[method-assign]
    was = gc.isenabled()
    (gc.enable if enabled else gc.disable)()
    try:
        follower.follow(stop, trigger_ms=1)
        after = gc.isenabled()
    finally:
        (gc.enable if was else gc.disable)()
    assert during == [False]
    assert after is enabled


# -- the command ---------------------------------------------------------------------


def follow_command(tmp_path: Path, *options: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tickwheel.cli", "run", "--follow", "--input",
         str(tmp_path / "in"), "--output", str(tmp_path / "out"), *options],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_the_command_fires_on_the_wall_clock_stops_on_sigterm_and_carries_on(
        tmp_path: Path, inbox: Path) -> None:
    options = ("--clock", "wall", "--lateness-ms", "100", "--trigger-ms", "100")
    child = follow_command(tmp_path, *options)
    try:
        now = wall_clock_ms()
        land(inbox, "a.jsonl", [watch(now, "soon", now + 300),
                                watch(now, "later", now + 600_000)])
        wait_for(lambda: len(outcomes(tmp_path / "out")) == 1, "expiry", child)
        child.send_signal(signal.SIGTERM)
        output, _ = child.communicate(timeout=60)
    finally:
        child.kill()
    assert child.returncode == 0, output
    assert "SIGTERM: stopping after this batch" in output
    # The restart delivers to a processor too: every batch not yet delivered, the first
    # run's included, at least once.
    child = follow_command(tmp_path, *options, "--processor",
                           "tests.pipeline.processors:Collect")
    try:
        land(inbox, "b.jsonl", [cancel(wall_clock_ms(), "later")])
        wait_for(lambda: len(outcomes(tmp_path / "out")) == 2, "cancel", child)
        child.send_signal(signal.SIGINT)
        output, _ = child.communicate(timeout=60)
    finally:
        child.kill()
    assert child.returncode == 0, output
    assert [o[:2] for o in outcomes(tmp_path / "out")] == [("later", "cancelled"),
                                                           ("soon", "expired")]
    assert "delivered 2 outcomes" in output, output


def test_a_kill_9_then_a_restart_gives_the_outcomes_of_an_uninterrupted_run(
        tmp_path: Path, inbox: Path) -> None:
    lines = random_log(11, rows=3_000)
    parts = [lines[i:i + 300] for i in range(0, len(lines), 300)]
    options = ("--lateness-ms", str(LATENESS_MS), "--trigger-ms", "20")
    child = follow_command(tmp_path, *options)
    files_log = tmp_path / "out" / "_checkpoint" / "files.log"

    def files_read() -> int:  # names in the log (a batch run again logs its own again)
        if not files_log.exists():
            return 0
        return len({name for line in files_log.read_text().splitlines()
                    if line.endswith("]") for name in json.loads(line)[1]})

    try:
        for n, part in enumerate(parts[:6]):
            land(inbox, f"part-{n:02d}.jsonl", part)
            time.sleep(0.03)
        wait_for(lambda: files_read() >= 2, "a batch", child)
    finally:
        child.send_signal(signal.SIGKILL)
        child.communicate(timeout=60)
    for n, part in enumerate(parts[6:], start=6):
        land(inbox, f"part-{n:02d}.jsonl", part)
    child = follow_command(tmp_path, *options)
    try:
        wait_for(lambda: files_read() == len(parts), "every file", child)
        child.send_signal(signal.SIGTERM)
        output, _ = child.communicate(timeout=60)
    finally:
        child.kill()
    assert child.returncode == 0, output
    uninterrupted = tmp_path / "again"
    (uninterrupted / "in").mkdir(parents=True)
    for n, part in enumerate(parts):
        land(uninterrupted / "in", f"part-{n:02d}.jsonl", part)
    one_batch = engine(uninterrupted, None, lateness_ms=LATENESS_MS)
    one_batch.step()
    assert outcomes_skipped(tmp_path / "out") == outcomes_skipped(uninterrupted / "out")
    assert len(outcomes(tmp_path / "out")) > 100
    assert sorted(map(str, rows(tmp_path / "out" / "quarantine"))) == sorted(
        map(str, rows(uninterrupted / "out" / "quarantine")))


# -- outputs ---------------------------------------------------------------------------


def test_a_long_run_leaves_few_files_and_every_outcome(tmp_path: Path, inbox: Path) -> None:
    clock = WallClock(1_000)
    follower = engine(tmp_path, clock)
    for i in range(150):  # an expiry in every batch
        land(inbox, f"f{i:04d}.jsonl", [watch(1_000 + 10 * i, f"op{i}", 1_000 + 10 * i)])
        clock.ms = 1_000 + 10 * i + 101
        follower.step()
    files = list((tmp_path / "out" / "outcomes").iterdir())
    assert len(files) < 150 // 2
    assert sorted(o[0] for o in outcomes_all(tmp_path / "out")) == sorted(
        f"op{i}" for i in range(150))


def outcomes_all(output: Path) -> list[tuple[Any, ...]]:
    from tickwheel.pipeline.io.outputs import read_parquet_rows

    return [(r["op_id"], r["outcome"]) for r in read_parquet_rows(output / "outcomes")]


def test_outcomes_reach_a_sink_as_they_resolve_and_again_after_a_crash(
        tmp_path: Path, inbox: Path) -> None:
    from tests.pipeline.test_sink import Flaky
    from tickwheel.pipeline.delivery.sink import OutcomeSink

    processor = Flaky()
    with OutcomeSink(processor, congestion_retry_delay_ms=1) as sink:
        follower = engine(tmp_path, wall_clock_ms, lateness_ms=20, sink=sink)
        now = wall_clock_ms()
        land(inbox, "a.jsonl", [watch(now, f"op{i}", now + 50 + i) for i in range(20)])
        stop = threading.Event()
        runner = threading.Thread(target=lambda: follower.follow(stop, trigger_ms=50))
        runner.start()
        eventually(lambda: len(set(processor.seen)) >= 20, 60)
        stop.set()
        runner.join(timeout=60)
    assert sorted(set(processor.seen)) == sorted(f"op{i}" for i in range(20))
    # The mark says which batches were settled; a start delivers every later one again.
    mark = tmp_path / "out" / "_checkpoint" / "delivered"
    assert int(mark.read_text()) >= 0
    mark.write_text("-1")
    again = Flaky()
    with OutcomeSink(again, congestion_retry_delay_ms=1) as sink:
        restarted = engine(tmp_path, wall_clock_ms, lateness_ms=20, sink=sink)
        stop = threading.Event()
        stop.set()  # one pass: the catch-up, no batch
        restarted.follow(stop)
    assert sorted(set(again.seen)) == sorted(f"op{i}" for i in range(20))


# -- the checkpoint's files ------------------------------------------------------------


def test_seen_op_ids_survive_a_restart_through_their_segments_not_the_state(
        tmp_path: Path, inbox: Path) -> None:
    clock = WallClock(1_000)
    follower = engine(tmp_path, clock, dedupe_retention_ms=500)
    land(inbox, "a.jsonl", [watch(1_000 + i, f"op{i}", 1_050 + i) for i in range(200)])
    clock.ms = 1_400
    follower.step()
    assert len(outcomes(tmp_path / "out")) == 200
    checkpoint = tmp_path / "out" / "_checkpoint"
    state_bytes = (checkpoint / "state").stat().st_size
    assert b"op199" not in (checkpoint / "state").read_bytes()  # in a segment only
    assert "op199" in seen_on_disk(checkpoint / "seen")
    again = engine(tmp_path, clock, dedupe_retention_ms=500)
    land(inbox, "b.jsonl", [watch(1_350, "op0", 9_000),  # within the retention: a duplicate
                            watch(1_700, "op1", 9_000)])  # past it: a new operation
    clock.ms = 1_801
    again.step()
    quarantined = rows(tmp_path / "out" / "quarantine")
    assert [(json.loads(q["raw"])["ts_ms"], q["reason"]) for q in quarantined] == [
        (1_350, "duplicate_op_id")]
    assert again.ops.stage.pending.keys() == {"op1"}
    assert state_bytes < 20_000


def test_the_state_bytes_counted_are_those_on_disk_after_each_batch_and_a_restart(
        tmp_path: Path, inbox: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The operations' log is rewritten once it holds more than 2 * pending + 16.
    monkeypatch.setattr(entry_log, "REWRITE_SLACK", 16)
    clock = WallClock(1_000)
    follower = engine(tmp_path, clock, dedupe_retention_ms=500)
    checkpoint = tmp_path / "out" / "_checkpoint"

    def on_disk() -> int:
        return sum(path.stat().st_size
                   for path in [checkpoint / "state", checkpoint / "keys.log",
                                checkpoint / "ops.log", *(checkpoint / "seen").iterdir()]
                   if path.exists())

    land(inbox, "a.jsonl", [watch(1_000 + i, f"op{i}", 5_000) for i in range(300)])
    clock.ms = 1_400
    follower.step()
    pending = follower.counts().state_bytes
    assert pending == on_disk()
    clock.ms = 6_100  # all 300 expire: the log is rewritten with none
    follower.step()
    resolved = follower.counts().state_bytes
    assert resolved == on_disk() and resolved < pending
    assert (checkpoint / "ops.log").stat().st_size < 100
    assert engine(tmp_path, clock, dedupe_retention_ms=500).counts().state_bytes == resolved


def test_a_batch_writes_what_it_changed_not_every_operation_pending(
        tmp_path: Path, inbox: Path) -> None:
    clock = WallClock(1_000)
    follower = engine(tmp_path, clock)
    checkpoint = tmp_path / "out" / "_checkpoint"
    land(inbox, "a.jsonl", [watch(1_000, f"op{i}", 10**9, keys=[f"k{i}"])
                            for i in range(2_000)])
    clock.ms = 1_200
    follower.step()
    sizes = {name: (checkpoint / name).stat().st_size for name in ("keys.log", "ops.log")}
    land(inbox, "b.jsonl", [watch(1_300, "one-more", 10**9, keys=["k0"])])
    clock.ms = 1_500
    follower.step()
    for name, before in sizes.items():  # one operation's entries, not 2,001
        assert 0 < (checkpoint / name).stat().st_size - before < 1_000
    assert (checkpoint / "state").stat().st_size < 1_000
    restarted = engine(tmp_path, clock)
    assert restarted.counts().pending == 2_001


def test_a_state_that_tickwheel_did_not_write_is_refused_by_name(tmp_path: Path,
                                                                 inbox: Path) -> None:
    engine(tmp_path, None).step()
    (tmp_path / "out" / "_checkpoint" / "state").write_bytes(b"\x00garbage")
    with pytest.raises(ValueError, match=r"state .* cannot be read"):
        engine(tmp_path, None)


def test_a_state_of_an_earlier_version_is_refused_naming_it(tmp_path: Path,
                                                           inbox: Path) -> None:
    engine(tmp_path, None).step()
    state = tmp_path / "out" / "_checkpoint" / "state"
    state.write_bytes(marshal.dumps((2, 0, (), ())))  # version 2 had no list of files
    with pytest.raises(ValueError, match=r"state version 2 in .* is not supported"):
        engine(tmp_path, None)


@pytest.mark.parametrize(("name", "line"), [
    ("ops.log", '[0, [[1, "!!not base64"]]]'),
    ("keys.log", '[0, [[1, "AAAA"]]]'),  # base64, but not marshal's
    ("files.log", '[0, 5]'),
])
def test_a_log_of_the_checkpoint_that_tickwheel_did_not_write_is_refused_by_name(
        tmp_path: Path, inbox: Path, name: str, line: str) -> None:
    land(inbox, "a.jsonl", [watch(1_000, "a", 10**9)])
    engine(tmp_path, None).step()
    with open(tmp_path / "out" / "_checkpoint" / name, "a") as log:
        log.write(line + "\n")
    with pytest.raises(ValueError, match=rf"log .*{name} cannot be read .* give another "):
        engine(tmp_path, None)


@pytest.mark.parametrize("name", ["keys.log", "ops.log", "files.log", "state",
                                  "tickwheel.json"])
def test_a_file_of_the_checkpoint_replaced_by_a_symlink_is_refused_not_followed(
        tmp_path: Path, inbox: Path, name: str) -> None:
    clock = WallClock(1_000)
    land(inbox, "a.jsonl", [watch(500, "a", 10**9, ["k"])])
    engine(tmp_path, clock, dedupe_retention_ms=60_000).step()
    path = tmp_path / "out" / "_checkpoint" / name
    assert path.is_file()
    outside = tmp_path / f"outside-{name}"
    path.rename(outside)  # the same bytes, now outside the checkpoint
    path.symlink_to(outside)
    with pytest.raises(ValueError, match=rf"{name} is a symbolic link"):
        engine(tmp_path, clock, dedupe_retention_ms=60_000)


@pytest.mark.parametrize(("name", "line"), [
    ("0000000000.log", "garbage"),
    ("0000000000.log", '[0, [["op", "not a time"]]]'),
    ("notes.txt", "a file of someone else's"),
    (".0000000000.log.tmp", "a temporary file"),
])
def test_seen_op_ids_that_tickwheel_did_not_write_are_refused_by_name(
        tmp_path: Path, inbox: Path, name: str, line: str) -> None:
    land(inbox, "a.jsonl", [watch(1_000, "a", 10**9), watch(5_000, "b", 10**9)])
    engine(tmp_path, None).step()
    with open(tmp_path / "out" / "_checkpoint" / "seen" / name, "a") as segment:
        segment.write(line + "\n")
    with pytest.raises(ValueError, match=r"checkpoint .* cannot be read .* give another "):
        engine(tmp_path, None)


@pytest.mark.parametrize("where", ["a file in place of the directory",
                                   "a directory in place of a segment"])
def test_seen_op_ids_in_the_wrong_shape_are_refused_by_name(
        tmp_path: Path, inbox: Path, where: str) -> None:
    land(inbox, "a.jsonl", [watch(1_000, "a", 10**9), watch(5_000, "b", 10**9)])
    engine(tmp_path, None).step()
    seen_dir = tmp_path / "out" / "_checkpoint" / "seen"
    if where.startswith("a file"):
        shutil.rmtree(seen_dir)
        seen_dir.write_text("ids")
        wrong = seen_dir
    else:
        wrong = seen_dir / "0000000007.log"
        wrong.mkdir()
    with pytest.raises(ValueError, match=rf"checkpoint .* cannot be read \({wrong} is not"):
        engine(tmp_path, None)


def test_the_seen_op_ids_on_disk_stay_within_the_retention_as_a_service_runs(
        tmp_path: Path, inbox: Path) -> None:
    # A retention of 8 s: files of 1 s, 50 new ids every 200 ms for 30 s.
    clock = WallClock(1_000)
    follower = engine(tmp_path, clock, dedupe_retention_ms=8_000)
    seen_dir = tmp_path / "out" / "_checkpoint" / "seen"
    held = []
    for n in range(150):
        t = 1_000 + 200 * n
        land(inbox, f"{n:04d}.jsonl", [watch(t, f"op{n}-{i}", t + 50) for i in range(50)])
        clock.ms = t + 150
        follower.step()
        held.append(len(seen_on_disk(seen_dir)))
    # The retention keeps 40 batches' ids, and a file at the edge up to 5 more.
    assert max(held[60:]) <= 45 * 50
    assert min(held[60:]) >= 40 * 50
    assert len(list(seen_dir.iterdir())) <= 10
    # What a restart reads is what the resolver kept.
    restarted = engine(tmp_path, clock, dedupe_retention_ms=8_000)
    kept = restarted.ops.stage.seen_op_ids
    assert {f"op149-{i}" for i in range(50)} <= kept
    assert not any(op_id.startswith("op100-") for op_id in kept)


def test_a_pending_operation_whose_segment_went_still_quarantines_its_id_after_a_restart(
        tmp_path: Path, inbox: Path) -> None:
    clock = WallClock(1_000)
    follower = engine(tmp_path, clock, dedupe_retention_ms=500)
    land(inbox, "a.jsonl", [watch(1_000, "long", 10**9)])
    clock.ms = 1_200
    follower.step()
    for n, t in enumerate((2_500, 4_000)):  # new segments; the first goes
        land(inbox, f"b{n}.jsonl", [watch(t, f"short{n}", t + 10)])
        clock.ms = t + 200
        follower.step()
    seen_dir = tmp_path / "out" / "_checkpoint" / "seen"
    assert "long" not in "".join(path.read_text() for path in seen_dir.iterdir())
    again = engine(tmp_path, clock, dedupe_retention_ms=500)
    land(inbox, "c.jsonl", [watch(4_250, "long", 10**9)])
    clock.ms = 4_500
    again.step()
    assert [json.loads(q["raw"])["op_id"] for q in rows(tmp_path / "out" / "quarantine")
            ] == ["long"]
    assert again.counts().pending == 1


def test_a_segment_a_crashed_first_batch_left_is_not_read_as_committed(
        tmp_path: Path, inbox: Path) -> None:
    # A first batch that saw "phantom" crashed before its state; the batch that runs
    # in its place sees other ids.
    seen_dir = tmp_path / "out" / "_checkpoint" / "seen"
    seen_dir.mkdir(parents=True)
    (seen_dir / "0000000000.log").write_text('[0, [["phantom", 1000]]]\n')
    land(inbox, "a.jsonl", [watch(1_000, "a", 10**9), watch(5_000, "b", 10**9)])
    engine(tmp_path, None).step()
    again = engine(tmp_path, None)
    assert "phantom" not in again.ops.stage.seen_op_ids
    land(inbox, "b.jsonl", [watch(5_000, "phantom", 10**9), watch(9_000, "c", 10**9)])
    again.step()
    assert rows(tmp_path / "out" / "quarantine") == []
    assert again.counts().pending == 3


@pytest.mark.parametrize("lost", ["seen", "ops.log", "files.log"])
def test_a_checkpoint_copied_in_part_is_refused_naming_what_it_lacks(
        tmp_path: Path, inbox: Path, lost: str) -> None:
    clock = WallClock(1_000)
    land(inbox, "a.jsonl", [watch(1_000, "a", 10**9), watch(1_010, "b", 1_200)])
    engine(tmp_path, clock, dedupe_retention_ms=60_000).step()
    clock.ms = 1_500
    engine(tmp_path, clock, dedupe_retention_ms=60_000).step()  # b expired
    checkpoint = tmp_path / "out" / "_checkpoint"
    path = checkpoint / lost
    shutil.rmtree(path) if path.is_dir() else path.unlink()
    with pytest.raises(ValueError, match=rf"lacks what its state relies on: {path}.* "
                                         r"\(missing"):
        engine(tmp_path, clock, dedupe_retention_ms=60_000)


@pytest.mark.parametrize("cut", ["keys.log", "ops.log", "files.log", "seen/0000000000.log"])
def test_a_log_cut_short_at_a_line_is_refused_naming_its_last_batch(
        tmp_path: Path, inbox: Path, cut: str) -> None:
    # A whole line gone reads as a log that never had it: only the state can tell.
    clock = WallClock(1_000)
    for batch, name in enumerate(["a", "b"]):
        clock.ms = 1_000 * (batch + 1)
        land(inbox, f"{name}.jsonl", [watch(clock.ms - 500, name, 10**9, [f"k{batch}"])])
        engine(tmp_path, clock, dedupe_retention_ms=60_000).step()
    path = tmp_path / "out" / "_checkpoint" / cut
    lines = path.read_bytes().splitlines(keepends=True)
    assert len(lines) == 2
    path.write_bytes(lines[0])
    why = (r"\(missing 1 of the segments 0 to 1" if cut.startswith("seen")
           else r"\(cut short: its last batch is 0, not 1\)")
    where = path.parent if cut.startswith("seen") else path
    with pytest.raises(ValueError, match=rf"lacks what its state relies on: {where} {why}"):
        engine(tmp_path, clock, dedupe_retention_ms=60_000)


def test_a_batch_run_again_after_a_crash_replaces_all_its_first_attempt_wrote(
        tmp_path: Path, inbox: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    clock = WallClock(1_200)
    land(inbox, "a.jsonl", [watch(1_000, "x", 5_000)])
    land(inbox, "b.jsonl", [cancel(1_050, "x")])
    first = engine(tmp_path, clock)

    def crash(*_args: object) -> None:
        raise KeyboardInterrupt("killed after the outputs, before the state")

    monkeypatch.setattr(first, "_commit", crash)
    with pytest.raises(KeyboardInterrupt):
        first.step()
    assert [o[:2] for o in outcomes(tmp_path / "out")] == [("x", "cancelled")]
    first.close()
    (inbox / "b.jsonl").unlink()  # the input changed before the restart
    again = engine(tmp_path, clock)
    again.step()  # batch 0 again: nothing resolves now, so it writes no outcome file
    assert outcomes(tmp_path / "out") == []
    clock.ms = 10_000
    again.step()
    assert [o[:2] for o in outcomes(tmp_path / "out")] == [("x", "expired")]


@pytest.mark.parametrize("spelling", ["dotdot", "symlink"])
def test_the_input_spelled_another_way_is_the_same_input(tmp_path: Path, inbox: Path,
                                                         spelling: str) -> None:
    land(inbox, "a.jsonl", [watch(1_000, "a", 10**9)])
    first = engine(tmp_path, None)
    first.step()
    first.close()
    if spelling == "dotdot":
        other = inbox / ".." / "in"
    else:
        other = tmp_path / "link"
        other.symlink_to(inbox)
    again = LocalFollowEngine(other, tmp_path / "out", lateness_ms=100)
    assert again.step() is None  # nothing new to read
    again.close()


def test_a_checkpoint_of_another_input_directory_is_refused_naming_both(
        tmp_path: Path, inbox: Path) -> None:
    land(inbox, "a.jsonl", [watch(1_000, "a", 10**9)])
    engine(tmp_path, None).close()
    (tmp_path / "elsewhere").mkdir()
    with pytest.raises(ValueError, match=rf"reads the input {inbox}, not "
                                         rf"{tmp_path / 'elsewhere'}"):
        LocalFollowEngine(tmp_path / "elsewhere", tmp_path / "out", lateness_ms=100)


@pytest.mark.parametrize("name", ["../secret.txt", "/etc/hostname", ".."])
def test_a_checkpoint_naming_a_file_outside_the_input_is_refused(
        tmp_path: Path, inbox: Path, name: str) -> None:
    (tmp_path / "secret.txt").write_text('{"ts_ms": 1, "type": "tick"}\n')
    land(inbox, "a.jsonl", [watch(1_000, "a", 10**9)])
    first = engine(tmp_path, None)
    first.step()
    first.close()
    plan = tmp_path / "out" / "_checkpoint" / "plan.json"
    plan.write_text(json.dumps({"batch": 1, "files": [name], "clock_ms": None}))
    again = engine(tmp_path, None)
    with pytest.raises(ValueError, match=r"plan .*plan\.json cannot be read"):
        again.step()
    assert not (tmp_path / "out" / "quarantine" / "batch-000000001.parquet").exists()


def test_metrics_port_0_prints_the_port_the_system_gave(tmp_path: Path, inbox: Path) -> None:
    import re
    import urllib.request

    child = follow_command(tmp_path, "--metrics-port", "0")
    try:
        assert child.stdout is not None
        line = child.stdout.readline()
        found = re.fullmatch(r"metrics on http://127\.0\.0\.1:(\d+)/metrics\n", line)
        assert found is not None and int(found.group(1)) > 0, line
        with urllib.request.urlopen(f"http://127.0.0.1:{found.group(1)}/metrics",
                                    timeout=30) as page:
            assert page.status == 200
        assert "following" in child.stdout.readline()  # SIGTERM stops it from here on
    finally:
        child.send_signal(signal.SIGTERM)
        child.communicate(timeout=60)
    assert child.returncode == 0


@pytest.mark.parametrize("processor", ["Stuck", "Congested", "Raises"])
def test_sigterm_stops_within_the_stop_timeout_whatever_the_processor_does(
        tmp_path: Path, inbox: Path, processor: str) -> None:
    now = wall_clock_ms()
    land(inbox, "a.jsonl", [watch(now, f"op-{i}", now) for i in range(40)])
    child = follow_command(tmp_path, "--clock", "wall", "--lateness-ms", "0",
                           "--trigger-ms", "50", "--stop-timeout-ms", "2000",
                           "--processor", f"tests.pipeline.processors:{processor}")
    try:
        wait_for(lambda: len(outcomes(tmp_path / "out")) == 40, "expiries", child)
        time.sleep(0.5)  # the processor has the outcomes in hand
        child.send_signal(signal.SIGTERM)
        began = time.monotonic()
        output, _ = child.communicate(timeout=60)
        took = time.monotonic() - began
    finally:
        child.kill()
    assert child.returncode == 0, output
    # The stop waits the stop timeout (2 s) for the processor, then exits: a few
    # seconds of margin for the interpreter's exit on a loaded machine, no more.
    assert took < 8, (took, output)
    if processor == "Stuck":
        assert took >= 1.9, (took, output)  # it did wait for the stuck processor
    assert "40 outcomes not delivered: the next start delivers them" in output, output
    # The next start delivers them, to a processor that works.
    child = follow_command(tmp_path, "--clock", "wall", "--lateness-ms", "0",
                           "--trigger-ms", "50",
                           "--processor", "tests.pipeline.processors:Collect")
    try:
        assert child.stdout is not None
        assert "following" in child.stdout.readline()
        mark = tmp_path / "out" / "_checkpoint" / "delivered"
        wait_for(lambda: mark.exists() and mark.read_text() == "0", "the delivery", child)
        child.send_signal(signal.SIGTERM)
        output, _ = child.communicate(timeout=60)
    finally:
        child.kill()
    assert child.returncode == 0, output
    assert "delivered 40 outcomes" in output, output
    assert "not delivered: the next start" not in output


def test_a_backlog_is_read_in_batches_within_the_budget_with_the_same_outcomes(
        tmp_path: Path, inbox: Path) -> None:
    lines = random_log(5, rows=2_000)
    for i in range(0, len(lines), 100):
        land(inbox, f"part-{i // 100:03d}.jsonl", lines[i:i + 100])
    files = sorted(inbox.iterdir())
    size = max(p.stat().st_size for p in files)
    budgeted = engine(tmp_path, None, lateness_ms=LATENESS_MS, max_bytes_per_batch=3 * size)
    batches = []
    while (batch := budgeted.step()) is not None:
        assert batch.files <= 3
        batches.append(batch)
    assert budgeted.backlog == 0 and sum(b.files for b in batches) == len(files)
    assert len(batches) >= len(files) // 3
    budgeted.close()
    by_files = LocalFollowEngine(inbox, tmp_path / "other", lateness_ms=LATENESS_MS,
                                 max_files_per_batch=5)
    first = by_files.step()
    assert first is not None and first.files == 5 and by_files.backlog == len(files) - 5
    while by_files.step() is not None:
        pass
    whole = LocalFollowEngine(inbox, tmp_path / "whole", lateness_ms=LATENESS_MS)
    assert whole.step() is not None
    assert outcomes(tmp_path / "out") == outcomes(tmp_path / "other") == outcomes(
        tmp_path / "whole")


def test_on_the_wall_clock_a_backlog_left_by_the_budget_is_never_late(
        tmp_path: Path, inbox: Path) -> None:
    """Files that landed in time but wait for later batches (the budget holds fewer):
    the batch that leaves them, and those that read them, do not move time by the
    clock, which has passed their rows; once they are read, it does."""
    clock = WallClock(1_050)
    for n in range(4):
        land(inbox, f"part-{n}.jsonl", [watch(1_000 + n, f"op-{n}", 90_000)])
    size = max(p.stat().st_size for p in inbox.iterdir())
    follower = engine(tmp_path, clock, max_bytes_per_batch=size)
    clock.ms = 5_000  # the batches come long after the files landed
    first = follower.step()
    assert first is not None and first.files == 1 and follower.backlog == 3
    while follower.backlog:
        batch = follower.step()
        assert batch is not None and batch.release_ms is not None
        assert batch.release_ms < 1_003  # the rows themselves move time, not the clock
    moved = follower.step()  # the backlog read, the clock moves time again
    assert moved is not None and moved.release_ms == 4_900
    assert (follower.counts().quarantined, follower.counts().pending) == (0, 4)
    follower.close()


def test_a_row_too_far_ahead_of_the_wall_clock_is_quarantined_as_future(
        tmp_path: Path, inbox: Path) -> None:
    clock = WallClock(10_000)
    follower = engine(tmp_path, clock, max_future_ms=60_000)
    land(inbox, "a.jsonl", [watch(9_950, "soon", 10_500),
                            watch(70_000, "at-the-bound", 80_000),
                            watch(10**15, "far", 10**15 + 1)])
    follower.step()
    quarantined = rows(tmp_path / "out" / "quarantine")
    assert [(json.loads(q["raw"])["op_id"], q["reason"]) for q in quarantined] == [
        ("far", "future")]
    clock.ms = 11_000
    follower.step()
    # Time moved with the clock, not to the far row: only "soon" expired.
    assert [o[:2] for o in outcomes(tmp_path / "out")] == [("soon", "expired")]
    assert follower.counts().by_reason == {"future": 1}


def test_max_future_ms_is_refused_where_it_does_not_apply(tmp_path: Path) -> None:
    for extra in (["--clock", "event"], ["--clock", "event", "--engine", "spark"]):
        done = subprocess.run(
            [sys.executable, "-m", "tickwheel.cli", "run", "--follow", "--input",
             str(tmp_path), "--output", str(tmp_path / "out"), "--max-future-ms", "10", *extra],
            check=False, capture_output=True, text=True, timeout=120)
        assert done.returncode == 2 and "--max-future-ms applies" in done.stdout, done.stdout


def test_a_file_that_changes_after_it_was_read_is_warned_of_and_counted(
        tmp_path: Path, inbox: Path, caplog: pytest.LogCaptureFixture) -> None:
    land(inbox, "a.jsonl", [watch(1_000, "a", 10**9)])
    follower = engine(tmp_path, None)
    follower.step()
    assert follower.counts().files_changed == 0
    with open(inbox / "a.jsonl", "a") as late_writer:  # a producer still appending
        late_writer.write(watch(1_100, "b", 10**9) + "\n")
    land(inbox, "c.jsonl", [watch(1_200, "c", 10**9)])
    follower.step()
    assert follower.counts().files_changed == 1
    assert "a.jsonl' changed after it was read" in caplog.text
    follower.step()  # warned once per change
    assert follower.counts().files_changed == 1


def test_a_listing_checks_a_bounded_number_of_read_files_in_turn(
        tmp_path: Path, inbox: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(follow, "_CHECKS_PER_LISTING", 2)
    for n in range(6):
        land(inbox, f"f{n}.jsonl", [watch(1_000 + n, f"op{n}", 10**9)])
    follower = engine(tmp_path, None)
    follower.step()
    checked: list[str] = []
    stat_of = FileStat.of
    monkeypatch.setattr(FileStat, "of", lambda path: checked.append(path.name)
                        or stat_of(path))
    with open(inbox / "f5.jsonl", "a") as late_writer:  # the last one read
        late_writer.write(watch(1_100, "late", 10**9) + "\n")
    changed = []
    for n in range(3):
        land(inbox, f"g{n}.jsonl", [watch(2_000 + n, f"g{n}", 10**9)])
        before = len(checked)
        follower.step()
        changed.append(follower.counts().files_changed)
        assert len([c for c in checked[before:] if c.startswith("f")]) <= 2
    assert changed == [0, 0, 1]  # its turn came at the third listing


def test_each_batch_output_names_the_epoch_of_the_owner_that_wrote_it(
        tmp_path: Path, inbox: Path) -> None:
    from tickwheel.pipeline.io.outputs import owner_epoch

    land(inbox, "a.jsonl", [watch(1_000, "a", 1_000), cancel(1_000, "b"), "{bad"])
    with engine(tmp_path, WallClock(5_000)) as first:
        first.step()
        epoch = first._owner.epoch
    assert {owner_epoch(p) for p in (tmp_path / "out").glob("*/batch-*.parquet")} == {epoch}
    land(inbox, "b.jsonl", [watch(6_000, "c", 6_000)])
    with engine(tmp_path, WallClock(10_000)) as second:
        second.step()
        assert second._owner.epoch == epoch + 1
    newest = sorted((tmp_path / "out" / "outcomes").glob("batch-*.parquet"))[-1]
    assert owner_epoch(newest) == epoch + 1


def test_an_owner_that_loses_its_checkpoint_while_writing_does_not_commit(
        tmp_path: Path, inbox: Path) -> None:
    from tickwheel.pipeline.io.ownership import LOCK_FILE, OwnershipLost

    land(inbox, "a.jsonl", [watch(1_000, "a", 1_000)])
    stale = engine(tmp_path, WallClock(5_000))
    write = stale._write_outputs

    def write_then_lose(*args: Any) -> None:
        write(*args)
        (stale.checkpoint_dir / LOCK_FILE).unlink()  # another owner takes over meanwhile

    stale._write_outputs = write_then_lose  # type: ignore[method-assign]
    with pytest.raises(OwnershipLost):
        stale.step()
    stale.close()
    with engine(tmp_path, WallClock(5_000)) as successor:
        assert successor.batch_id == -1  # nothing was committed: the batch runs again
        successor.step()
    assert [o[:2] for o in outcomes(tmp_path / "out")] == [("a", "expired")]


# -- rows handed over by an intake in the same process ----------------------------


def _stat(path: Path) -> FileStat:
    stat = FileStat.of(path)
    assert stat is not None
    return stat


def test_rows_handed_over_for_a_file_are_taken_instead_of_parsing_it(
        tmp_path: Path, inbox: Path) -> None:
    land(inbox, "a.jsonl", [watch(1_000, "on-disk", 1_050)])
    feed = IntakeFeed(wall_clock_ms)
    follower = engine(tmp_path, None, feed=feed)
    # Rows that differ from the file's: which ones resolve tells which were read.
    feed.offer("a.jsonl", [compact_wire(watch(1_000, "handed", 1_050))],
               _stat(inbox / "a.jsonl"))
    land(inbox, "b.jsonl", [watch(2_000, "later", 10**9)])
    follower.step()
    assert [o[0] for o in outcomes(tmp_path / "out")] == ["handed"]


def test_rows_handed_over_for_a_file_that_changed_since_are_not_taken(
        tmp_path: Path, inbox: Path) -> None:
    land(inbox, "a.jsonl", [watch(1_000, "on-disk", 1_050)])
    feed = IntakeFeed(wall_clock_ms)
    follower = engine(tmp_path, None, feed=feed)
    stat = _stat(inbox / "a.jsonl")
    feed.offer("a.jsonl", [compact_wire(watch(1_000, "handed", 1_050))],
               FileStat(stat.size + 1, stat.mtime_ns))
    land(inbox, "b.jsonl", [watch(2_000, "later", 10**9)])
    follower.step()
    assert [o[0] for o in outcomes(tmp_path / "out")] == ["on-disk"]


def test_rows_handed_over_after_their_file_was_read_are_not_kept(
        tmp_path: Path, inbox: Path) -> None:
    land(inbox, "a.jsonl", [watch(1_000, "a", 10**9)])
    feed = IntakeFeed(wall_clock_ms, max_offered_rows=1)
    follower = engine(tmp_path, None, feed=feed)
    follower.step()
    feed.offer("a.jsonl", [compact_wire(watch(1_000, "a", 10**9))], _stat(inbox / "a.jsonl"))
    assert feed.offered_rows == 0  # late: it would never be taken
    feed.offer("b.jsonl", [compact_wire(watch(2_000, "b", 10**9))] * 2, FileStat(1, 1))
    assert feed.offered_rows == 0  # past the bound: parsed from disk when read
    feed.offer("c.jsonl", [compact_wire(watch(3_000, "c", 10**9))], FileStat(1, 1))
    assert feed.offered_rows == 1  # within it


def test_a_burst_of_fires_gives_way_between_its_shares_and_fires_whole_in_one_batch(
        tmp_path: Path, inbox: Path) -> None:
    """A minute's fires of many schedules go in shares of FIRES_PER_PIECE, with the
    engine giving way to its feed between them: the batch still fires every one of
    them."""
    clock = WallClock(1_000)
    land(inbox, "a.jsonl", [json.dumps({"ts_ms": 1_000, "type": "schedule",
                                        "schedule_id": f"s{n:04d}", "cron": "* * * * *"})
                            for n in range(1_000)])
    feed = CountingFeed(clock)
    follower = engine(tmp_path, clock, feed=feed)
    follower.step()
    feed.calls = 0
    clock.ms = 60_150  # every schedule's first occurrence, at 60,000, is due
    batch = follower.step()
    assert batch is not None and batch.outcomes == 1_000
    assert feed.calls >= 1_000 // partition.FIRES_PER_PIECE - 1
    follower.close()
