"""The Spark engine: the reference engine's outcomes, row for row, as a streaming job
that survives a hard kill. One Spark session for the whole test run (conftest)."""

from __future__ import annotations

import contextlib
import gzip
import json
import marshal
import os
import shutil
import signal
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.conftest import eventually, wait_for
from tests.pipeline.logs import LATENESS_MS, random_log
from tests.pipeline.spark_helpers import (
    committed_batches,
    expected_outcomes,
    expected_quarantine,
    outcomes_of,
    quarantine_of,
    reference,
    spark_rows_in,
    write_files,
)
from tests.pipeline.test_sink import Flaky
from tickwheel.pipeline.contract.events import Event, compact_wire
from tickwheel.pipeline.contract.routing import partition_of
from tickwheel.pipeline.delivery.sink import OutcomeSink
from tickwheel.pipeline.engines.following import wall_clock_ms
from tickwheel.pipeline.io.log_reader import read_events
from tickwheel.pipeline.io.outputs import owner_epoch, read_parquet_rows
from tickwheel.pipeline.spark import SparkEngine, _tasks, _wire
from tickwheel.pipeline.state.encoding import SPARK_CHECKPOINT_FORMAT as CHECKPOINT_FORMAT
from tickwheel.pipeline.state.seen_log import SeenLog, SeenSegment
from tickwheel.pipeline.tools.generator import GeneratorConfig, write_event_log

pytestmark = pytest.mark.spark



def test_all_the_input_and_its_end_go_in_one_micro_batch(spark: Any, tmp_path: Path,
                                                        ) -> None:
    log = tmp_path / "in"
    write_files(random_log(3), log, files=6)
    expected = reference(log)
    engine = SparkEngine(spark, log, tmp_path / "out", tmp_path / "ckpt",
                         lateness_ms=LATENESS_MS, partitions=3)
    result = engine.run()

    assert result.batches == 1  # the input and its end, in one micro-batch
    assert outcomes_of(tmp_path / "out") == expected_outcomes(expected)
    assert quarantine_of(tmp_path / "out") == expected_quarantine(expected)
    assert (result.held, result.pending) == (0, expected.pending)
    assert sorted((s.stage, s.partition) for s in result.partitions) == [
        (stage, p) for stage in ("key", "op") for p in range(3)]
    # Each op partition's executor task wrote its own outputs.
    assert sorted(p.name for p in (tmp_path / "out" / "outcomes").iterdir()) == [
        f"batch-000000000-{p:05d}.parquet" for p in range(3)]
    # Each names the epoch of the checkpoint's owner that wrote it.
    assert {owner_epoch(p) for p in (tmp_path / "out" / "outcomes").iterdir()} == {1}


def test_input_over_the_byte_budget_is_read_in_several_micro_batches(
        spark: Any, tmp_path: Path) -> None:
    # A stage's task holds its partition's share of a micro-batch.
    log = tmp_path / "in"
    write_files(random_log(4), log, files=6)
    expected = reference(log)
    budget = sum(path.stat().st_size for path in log.iterdir()) // 3 + 1
    engine = SparkEngine(spark, log, tmp_path / "out", tmp_path / "ckpt",
                         lateness_ms=LATENESS_MS, partitions=2, max_bytes_per_trigger=budget)
    result = engine.run()

    assert result.batches >= 4  # two files or so each, then the end of the input
    assert outcomes_of(tmp_path / "out") == expected_outcomes(expected)
    assert quarantine_of(tmp_path / "out") == expected_quarantine(expected)
    assert (result.held, result.pending) == (0, expected.pending)


# The last: workers that keep nothing, reading every partition from the state.
@pytest.mark.parametrize(("seed", "retention", "worker_cache"),
                         [(1, None, True), (2, 300, True), (2, 300, False)])
def test_outcomes_and_quarantine_equal_the_reference_engine(spark: Any, tmp_path: Path,
                                                            seed: int,
                                                            retention: int | None,
                                                            worker_cache: bool) -> None:
    log = tmp_path / "in"
    write_files(random_log(seed), log, files=4)
    expected = reference(log, retention)
    if retention is not None:  # the retention matters in this log
        assert len(expected.outcomes) > len(reference(log).outcomes)
    assert {o.outcome.value for o in expected.outcomes} == {"completed", "expired",
                                                            "cancelled", "error", "fired"}
    assert expected.quarantined_by_reason().keys() >= {"duplicate_op_id", "unparseable"}

    shuffle_partitions = spark.conf.get("spark.sql.shuffle.partitions")
    processor = Flaky()
    sink = OutcomeSink(processor, max_batch_size=50, congestion_retry_delay_ms=5)
    engine = SparkEngine(spark, log, tmp_path / "out", tmp_path / "ckpt",
                         lateness_ms=LATENESS_MS, partitions=2, max_files_per_trigger=1,
                         dedupe_retention_ms=retention, sink=sink, worker_cache=worker_cache)
    result = engine.run()
    delivery = sink.close()

    assert outcomes_of(tmp_path / "out") == expected_outcomes(expected)
    assert quarantine_of(tmp_path / "out") == expected_quarantine(expected)
    assert result.rows_in == expected.rows_in
    assert result.rows_applied == expected.rows_applied
    assert result.quarantined == len(expected.quarantine)
    assert (result.held, result.pending) == (0, expected.pending)
    assert result.ignored_cancels == expected.ignored_cancels
    assert result.quarantined_by_reason() == expected.quarantined_by_reason()
    assert result.outcomes_by_outcome() == expected.outcomes_by_outcome()
    # Each micro-batch's outcomes went through the dispatcher, retried on congestion.
    assert delivery.undelivered == 0
    assert sorted(processor.seen) == sorted(o.op_id for o in expected.outcomes)
    assert delivery.stats.batches["congestion"] > 0
    commits = tmp_path / "ckpt" / "query" / "commits"
    last_batch = max(int(p.name) for p in commits.iterdir() if p.name.isdigit())
    assert (tmp_path / "ckpt" / "delivered").read_text() == str(last_batch)
    if seed == 1:
        # As if the last run had stopped with only batch 0 settled: the next run
        # delivers the outcome files of every later batch first.
        (tmp_path / "ckpt" / "delivered").write_text("0")
        again = Flaky()
        with OutcomeSink(again, max_batch_size=50, congestion_retry_delay_ms=5) as sink:
            SparkEngine(spark, log, tmp_path / "out", tmp_path / "ckpt",
                        lateness_ms=LATENESS_MS, dedupe_retention_ms=retention,
                        sink=sink).run()
        later = [p for p in (tmp_path / "out" / "outcomes").glob("batch-*.parquet")
                 if int(p.stem.split("-")[1]) > 0]
        assert later and sorted(again.seen) == sorted(
            op_id for path in later for op_id in pq.read_table(path)["op_id"].to_pylist())
    # The query ran with a shuffle partition per partition; the session got its own
    # back.
    assert '"spark.sql.shuffle.partitions":"2"' in (tmp_path / "ckpt" / "query" / "offsets"
                                                    / "0").read_text()
    assert spark.conf.get("spark.sql.shuffle.partitions") == shuffle_partitions


EVENT_COLUMNS = {"ts_ms": "int64", "type": "string", "op_id": "string",
                 "keys": "list<string>", "deadline_ms": "int64", "condition": "string",
                 "targets": "map<string,int64>", "min_total": "int64", "key": "string",
                 "value": "int64", "error": "string"}


def write_parquet(lines: list[str], path: Path) -> None:
    """Well-formed JSON rows as a Parquet file with the contract's columns."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    types = {"int64": pa.int64(), "string": pa.string(), "list<string>": pa.list_(pa.string()),
             "map<string,int64>": pa.map_(pa.string(), pa.int64())}
    rows = [json.loads(line) for line in lines]
    columns = {}
    for name, kind in EVENT_COLUMNS.items():
        values = [row.get(name) for row in rows]
        if kind.startswith("map"):
            values = [None if v is None else list(v.items()) for v in values]
        columns[name] = pa.array(values, types[kind])
    pq.write_table(pa.table(columns), path)


def test_parquet_and_json_lines_gzipd_or_not_resolve_like_the_reference_engine(
        spark: Any, tmp_path: Path) -> None:
    """Parquet files are read whole by the reference engine's reader: a file whose
    columns have other types, or that is not Parquet at all, is quarantined, and so is
    what a gzip'd file cut short no longer holds. The
    packers read files from the paths Spark lists, which Hadoop prints without
    percent-encoding: names with spaces, a literal %20 and non-ASCII letters."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    log = tmp_path / "in"
    log.mkdir()
    lines = random_log(5, rows=1_200)
    size = len(lines) // 6
    now = time.time()
    carried: list[str] = []
    for i in range(6):
        part = lines[i * size:(i + 1) * size] if i < 5 else lines[5 * size:]
        if i % 2:
            # Odd parts as Parquet; their rows that do not fit its columns go to the next
            # JSON Lines file (malformed rows are never late, so moving them is harmless).
            path = log / f"events-{i:05d} 100%20 é.parquet"
            write_parquet([line for line in part if _is_typed(line)], path)
            carried = [line for line in part if not _is_typed(line)]
        else:
            path = log / f"events-{i:05d} 100%20 é.jsonl"
            text = "\n".join(carried + part) + "\n"
            if i == 4:
                path = path.with_name(f"{path.name}.gz")
                path.write_bytes(gzip.compress(text.encode()))
            else:
                path.write_text(text)
            carried = []
        # The two sources each take one file per micro-batch, in modification-time order.
        os.utime(path, (now + i, now + i))
    (log / "events-00006.jsonl").write_text("\n".join(carried) + "\n")
    os.utime(log / "events-00006.jsonl", (now + 6, now + 6))
    pq.write_table(pa.table({"ts_ms": pa.array([12_000.5]), "type": pa.array(["tick"])}),
                   log / "events-00006.parquet")
    (log / "events-00007.parquet").write_bytes(b"not parquet at all")
    for i in (6, 7):
        os.utime(log / f"events-{i:05d}.parquet", (now + i, now + i))
    cut = gzip.compress("\n".join(random_log(6, rows=200)).encode())
    (log / "events-00008.jsonl.gz").write_bytes(cut[: len(cut) // 2])
    os.utime(log / "events-00008.jsonl.gz", (now + 8, now + 8))
    expected = reference(log)
    reasons = expected.quarantined_by_reason()
    assert reasons["bad_type"] >= 1 and reasons["unparseable"] >= 1

    engine = SparkEngine(spark, log, tmp_path / "out", tmp_path / "ckpt",
                         lateness_ms=LATENESS_MS, partitions=2, max_files_per_trigger=1)
    result = engine.run()

    assert outcomes_of(tmp_path / "out") == expected_outcomes(expected)
    assert quarantine_of(tmp_path / "out") == expected_quarantine(expected)
    assert result.rows_in == expected.rows_in
    raws = [raw for _, raw, _ in quarantine_of(tmp_path / "out")]
    assert any("unreadable Parquet file events-00007.parquet" in raw for raw in raws)
    assert any(raw.startswith("unreadable gzip file events-00008.jsonl.gz after ")
               for raw in raws)


def _is_typed(line: str) -> bool:
    """Whether a random_log row fits the contract's Parquet columns."""
    try:
        row = json.loads(line)
    except ValueError:
        return False
    if not isinstance(row, dict) or set(row) - set(EVENT_COLUMNS):
        return False
    return all(isinstance(row.get(name), (int, type(None))) and not isinstance(
        row.get(name), bool) for name in ("ts_ms", "deadline_ms", "min_total", "value"))


def test_rows_behind_the_watermark_are_quarantined_as_late_never_lost(
        spark: Any, tmp_path: Path) -> None:
    log = tmp_path / "in"
    log.mkdir()
    early = [json.dumps({"ts_ms": 100_000 + i, "type": "update", "key": "k", "value": i})
             for i in range(50)]
    # Half of them compact, half not: a late row shows the line as read either way.
    behind = [json.dumps({"ts_ms": 1_000 + i, "type": "watch", "op_id": f"w{i}",
                          "keys": ["k"], "deadline_ms": 200_000, "condition": "any_update"},
                         separators=(",", ":") if i % 2 else None)
              for i in range(20)]
    (log / "a.jsonl").write_text("\n".join(early) + "\n")
    (log / "b.jsonl").write_text("\n".join(behind) + "\n")
    # Spark's file source reads files in modification-time order.
    os.utime(log / "b.jsonl", (time.time() + 10, time.time() + 10))
    engine = SparkEngine(spark, log, tmp_path / "out", tmp_path / "ckpt",
                         lateness_ms=LATENESS_MS, partitions=2, max_files_per_trigger=1)
    result = engine.run()
    late = [r for r in read_parquet_rows(tmp_path / "out" / "quarantine")
            if r["reason"] == "late"]
    assert sorted(r["raw"] for r in late) == sorted(behind)
    assert result.rows_in == 70
    assert result.rows_in == result.rows_applied + result.quarantined + result.held


def test_a_run_without_final_holds_the_rows_the_watermark_has_not_passed(
        spark: Any, tmp_path: Path) -> None:
    log = tmp_path / "in"
    write_files(random_log(3, rows=400), log, files=2)
    engine = SparkEngine(spark, log, tmp_path / "out", tmp_path / "ckpt",
                         lateness_ms=LATENESS_MS, partitions=2)
    first = engine.run(final=False)
    assert first.held > 0
    assert first.rows_in == first.rows_applied + first.quarantined + first.held
    done = engine.run(final=True)
    assert done.held == 0
    assert outcomes_of(tmp_path / "out") == expected_outcomes(reference(log))


def test_a_final_run_ends_the_input_in_its_one_micro_batch_in_every_partition(
        spark: Any, tmp_path: Path) -> None:
    """The operations sit in different partitions, and one's deadline falls between its
    own latest row and the input's. Every partition ends the input at the same point
    (each chunk says how far its slice reached), so it expires, as in the reference
    engine, without a second micro-batch."""
    log = tmp_path / "in"
    log.mkdir()
    (log / "a.jsonl").write_text(
        '{"ts_ms":100,"type":"watch","op_id":"op-0","keys":[],"deadline_ms":500,'
        '"condition":"none"}\n'
        '{"ts_ms":1000,"type":"watch","op_id":"op-4","keys":[],"deadline_ms":9000,'
        '"condition":"none"}\n')
    engine = SparkEngine(spark, log, tmp_path / "out", tmp_path / "ckpt",
                         lateness_ms=LATENESS_MS, partitions=2)
    result = engine.run()
    assert result.batches == 1
    assert outcomes_of(tmp_path / "out") == expected_outcomes(reference(log))
    assert [r["op_id"] for r in read_parquet_rows(tmp_path / "out" / "outcomes")] == ["op-0"]
    assert {s.release_ms for s in engine.statuses()} == {1001}


class RacingQuery:
    """A query whose passes apply the end-of-input marker only from pass ``applies_at``
    on, as when a trigger had listed the control directory just before the marker
    was written."""

    def __init__(self, applies_at: int | None) -> None:
        self.applies_at = applies_at
        self.passes = 0

    def processAllAvailable(self) -> None:
        self.passes += 1


def racing_engine(spark: Any, tmp_path: Path, query: RacingQuery) -> SparkEngine:
    (tmp_path / "in").mkdir(parents=True)
    engine = SparkEngine(spark, tmp_path / "in", tmp_path / "out", tmp_path / "ckpt")

    def released_past_input() -> bool:
        return query.applies_at is not None and query.passes >= query.applies_at

    engine._released_past_input = released_past_input  # type: ignore[method-assign]
    engine._write_end_marker = lambda: 5_001  # type: ignore[method-assign]
    return engine


def test_a_final_run_waits_for_its_marker_when_a_trigger_raced_with_writing_it(
        spark: Any, tmp_path: Path) -> None:
    query = RacingQuery(applies_at=3)  # the input, a pass that missed the marker, then it
    racing_engine(spark, tmp_path, query)._process_all(query, final=True)  # type: ignore[arg-type]
    assert query.passes == 3


def test_a_final_run_whose_marker_is_never_applied_fails_instead_of_hanging(
        spark: Any, tmp_path: Path) -> None:
    query = RacingQuery(applies_at=None)
    engine = racing_engine(spark, tmp_path, query)
    with pytest.raises(RuntimeError, match="end-of-input marker was not applied"):
        engine._process_all(query, final=True)  # type: ignore[arg-type]
    assert query.passes == 11  # the input, then ten passes for the marker


def test_a_catch_up_waits_out_a_pass_that_missed_its_marker_and_fails_if_stuck(
        spark: Any, tmp_path: Path) -> None:
    """A catch-up goes on while the statuses show progress: a pass that missed its
    marker (the same statuses again) is waited out, up to the bound on passes."""
    query = RacingQuery(applies_at=1)
    engine = racing_engine(spark, tmp_path, query)
    markers: list[dict[str, Any]] = []
    engine._write_marker = lambda marker, kind="end": markers.append(marker)  # type: ignore[method-assign]
    # Pass 1 is the input's; the catch-up's first marker is missed once, then the
    # next statuses show a second round, then it is over.
    rounds = {1: ((0, 7),), 2: ((0, 7),), 3: ((0, 9), (1, 9)), 4: ()}
    engine._catching_up = lambda: rounds[query.passes]  # type: ignore[method-assign]
    engine._process_all(query, final=False)  # type: ignore[arg-type]
    assert query.passes == 4
    assert markers == [{"continue": True}, {"continue": True}]

    stuck = RacingQuery(applies_at=1)
    engine = racing_engine(spark, tmp_path / "stuck", stuck)
    engine._write_marker = lambda marker, kind="end": None  # type: ignore[method-assign]
    engine._catching_up = lambda: ((0, 7),)  # type: ignore[method-assign]
    with pytest.raises(RuntimeError, match="catch-up of schedules made no progress"):
        engine._process_all(stuck, final=False)  # type: ignore[arg-type]
    assert stuck.passes == 12  # the input, the marker's pass, then ten more


def test_a_checkpoint_keeps_its_partitions(spark: Any, tmp_path: Path) -> None:
    log = tmp_path / "in"
    log.mkdir()
    SparkEngine(spark, log, tmp_path / "out", tmp_path / "ckpt", partitions=2)
    with pytest.raises(ValueError, match="partitions=3 but the checkpoint"):
        SparkEngine(spark, log, tmp_path / "out", tmp_path / "ckpt", partitions=3)
    with pytest.raises(ValueError, match="dedupe_retention_ms=5 but the checkpoint"):
        SparkEngine(spark, log, tmp_path / "out", tmp_path / "ckpt", dedupe_retention_ms=5)


def test_a_delivery_that_fails_fails_the_run_instead_of_hanging(spark: Any,
                                                                tmp_path: Path) -> None:
    log = tmp_path / "in"
    write_files(random_log(3, rows=300), log, files=2)
    sink = OutcomeSink(Flaky(), max_batch_size=50)
    sink.close()  # nothing can be delivered, so no batch is ever settled
    engine = SparkEngine(spark, log, tmp_path / "out", tmp_path / "ckpt",
                         lateness_ms=LATENESS_MS, partitions=2, max_files_per_trigger=1,
                         sink=sink)
    with pytest.raises(Exception, match="delivering outcomes to the sink failed"):
        engine.run()
    # Only batches without outcomes (settled trivially) may be marked as settled.
    mark = tmp_path / "ckpt" / "delivered"
    settled = int(mark.read_text()) if mark.exists() else -1
    written = [int(p.stem.split("-")[1])
               for p in (tmp_path / "out" / "outcomes").glob("batch-*.parquet")]
    assert written and min(written) > settled


def _java_options(option: str) -> str:
    """``option`` added to the JVM options the run's JVMs take already (make test's)."""
    return f"{os.environ.get('JAVA_TOOL_OPTIONS', '')} {option}".strip()


KILLABLE_RUN = """
import sys
from pathlib import Path
from tickwheel.pipeline.spark import SparkEngine, spark_session
base = Path(sys.argv[1])
spark = spark_session("local[2]")
engine = SparkEngine(spark, base / "in", base / "out", base / "ckpt",
                     lateness_ms={lateness}, partitions=2, max_files_per_trigger=1)
engine.run(final=sys.argv[2] == "final")
"""


def test_a_hard_killed_run_restarted_on_its_checkpoint_loses_and_repeats_nothing(
        tmp_path: Path) -> None:
    lines = random_log(4, rows=3_000)
    first, more = lines[:2_000], lines[2_000:]
    script = KILLABLE_RUN.format(lateness=LATENESS_MS)
    killed = tmp_path / "killed"
    write_files(first, killed / "in", files=5)
    # A killed JVM cannot remove its scratch directories (block manager, state-store
    # working copies, artifacts): they go under tmp_path instead of /tmp.
    (tmp_path / "java-tmp").mkdir()
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable,
               SPARK_LOCAL_DIRS=str(tmp_path / "spark-local"),
               JAVA_TOOL_OPTIONS=_java_options(f"-Djava.io.tmpdir={tmp_path / 'java-tmp'}"))
    proc = subprocess.Popen([sys.executable, "-c", script, str(killed), "final"],
                            start_new_session=True, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    # Micro-batches committed (status files only keep the latest of them).
    wait_for(lambda: committed_batches(killed / "ckpt") >= 2, "two micro-batches", proc, 240)
    os.killpg(proc.pid, signal.SIGKILL)  # the driver, its JVM and its Python workers
    proc.wait()
    assert committed_batches(killed / "ckpt") < 6, "the kill came too late to interrupt anything"

    write_files(more, killed / "in", files=2, start=5)
    restart = subprocess.run([sys.executable, "-c", script, str(killed), "final"], check=False,
                             env=env, capture_output=True, text=True, timeout=600)
    assert restart.returncode == 0, restart.stderr[-3000:]

    # The outcomes of one uninterrupted run: the reference engine's on the same input.
    got = outcomes_of(killed / "out")
    assert len(set(got)) == len(got), "an outcome was written twice"
    whole = reference(killed / "in")
    assert got == expected_outcomes(whole)
    assert quarantine_of(killed / "out") == expected_quarantine(whole)


# Rows and outcomes cross the JVM compressed (_wire.CODEC).

def test_rows_come_back_as_they_were_sent_and_compressed() -> None:
    rows = [compact_wire(json.dumps({"ts_ms": n, "type": "update", "key": f"k{n % 7}",
                                     "value": n}, separators=(",", ":")))
            for n in range(2_000)]
    blob = _wire.encoded(rows)
    assert _wire.decoded(blob) == rows
    assert len(blob) < len(marshal.dumps(rows)) // 3
    assert _wire.decoded(b"") == []


def test_outcomes_cross_as_compressed_arrow_and_read_back_equal() -> None:
    from tickwheel.pipeline.contract.events import OutcomeKind
    from tickwheel.pipeline.contract.outcomes import OutcomeRow
    from tickwheel.pipeline.io.outputs import outcomes_table

    rows = [OutcomeRow(f"op-{n}", OutcomeKind.EXPIRED, 100 + n, 50, ("k",), None)
            for n in range(500)]
    table = outcomes_table(rows)
    blob = _wire._ipc(table)
    plain = pa.BufferOutputStream()
    with pa.ipc.new_stream(plain, table.schema) as writer:
        writer.write_table(table)
    assert len(blob) < plain.getvalue().size // 2
    assert _wire.from_ipc([blob, None], outcomes_table([])).equals(table)


@pytest.mark.parametrize(("uri", "path"), [
    ("file:/data/events 100%20 é.jsonl", "/data/events 100%20 é.jsonl"),
    ("file:///data/e.jsonl", "/data/e.jsonl"),
    ("file://host/data/e.jsonl", "/data/e.jsonl"),
])
def test_the_packers_read_the_local_file_a_listed_path_names(uri: str, path: str) -> None:
    assert _tasks.local_file(uri) == path


def test_a_listed_path_on_another_filesystem_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match=r"hdfs://nn/data/e\.jsonl.* is not on a local filesystem"):
        _tasks.local_file("hdfs://nn/data/e.jsonl")


def _listening(pid: int) -> list[str]:
    """The addresses process ``pid`` listens on (TCP, from /proc: no tools needed)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            target = os.readlink(fd)
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    found = []
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # LISTEN
                found.append(fields[1])
    return found


def _is_loopback(address: str) -> bool:
    host = address.split(":", maxsplit=1)[0]
    if len(host) == 8:  # IPv4, little-endian hex: 127.x.x.x ends in 7F
        return host.endswith("7F")
    return host in ("00000000000000000000000001000000",  # ::1
                    "0000000000000000FFFF00000100007F")  # ::ffff:127.0.0.1


@pytest.mark.spark
def test_a_local_driver_listens_on_loopback_only(spark: Any) -> None:
    pid = int(spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid())
    addresses = _listening(pid)
    assert addresses  # the driver's RPC and block manager ports at least
    assert all(_is_loopback(a) for a in addresses), addresses
    assert spark.conf.get("spark.driver.bindAddress") == "127.0.0.1"


def test_a_checkpoint_in_an_earlier_format_is_refused_with_its_format(spark: Any,
                                                                      tmp_path: Path) -> None:
    log = tmp_path / "in"
    write_files(random_log(1), log, files=1)
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "tickwheel.json").write_text(json.dumps(
        {"id": "x", "shards": 2, "labels": [0, 1], "lateness_ms": LATENESS_MS,
         "dedupe_retention_ms": None}))  # format 1 had no "format"
    with pytest.raises(ValueError, match=rf"format 1 .* reads format {CHECKPOINT_FORMAT}"):
        SparkEngine(spark, log, tmp_path / "out", tmp_path / "ckpt", lateness_ms=LATENESS_MS)
    # 2: one stage, sharded by op id; 3: the seen ids in the snapshot; 4: no tokens;
    # 5: the published manifests' log in a format of its own; 6: a partition's state
    # in one value; 7: the seen ids in a log of changes; 9: the clock from Spark's rate
    # source
    for made in (2, 3, 4, 5, 6, 7, 9):
        (tmp_path / "ckpt" / "tickwheel.json").write_text(json.dumps(
            {"format": made, "id": "x", "partitions": 2, "labels": [0, 1],
             "lateness_ms": LATENESS_MS, "dedupe_retention_ms": None}))
        with pytest.raises(ValueError, match=rf"format {made} .* reads format {CHECKPOINT_FORMAT}"):
            SparkEngine(spark, log, tmp_path / "out", tmp_path / "ckpt",
                        lateness_ms=LATENESS_MS)


def test_a_checkpoint_of_the_other_engine_is_refused_by_its_engine(spark: Any,
                                                                    tmp_path: Path) -> None:
    from tickwheel.pipeline.engines.follow import LocalFollowEngine

    log = tmp_path / "in"
    write_files(random_log(1), log, files=1)
    local = LocalFollowEngine(log, tmp_path / "local-out", checkpoint_dir=tmp_path / "local",
                              lateness_ms=LATENESS_MS)
    local.step()
    # Its format is not the Spark engine's either, so this names the engine, not a format.
    with pytest.raises(ValueError, match=r"belongs to the local engine"):
        SparkEngine(spark, log, tmp_path / "out", tmp_path / "local", lateness_ms=LATENESS_MS)
    SparkEngine(spark, log, tmp_path / "spark-out", tmp_path / "spark",
                lateness_ms=LATENESS_MS).run()
    with pytest.raises(ValueError, match=r"not written by this version of the local "
                                         rf"engine's follow mode \(engine spark, format "
                                         rf"{CHECKPOINT_FORMAT}; this one "
                                         r"reads format \d+\)"):
        LocalFollowEngine(log, tmp_path / "local-out2", checkpoint_dir=tmp_path / "spark",
                          lateness_ms=LATENESS_MS)


# -- follow mode --------------------------------------------------------------------------


def _land(directory: Path, name: str, lines: list[str]) -> None:
    tmp = directory / f".{name}.tmp"
    tmp.write_text("".join(f"{text}\n" for text in lines))
    tmp.rename(directory / name)


def _wait_until(condition: Any, what: str, runner: Any, timeout_s: float = 180) -> None:
    if not eventually(condition, timeout_s, unless=lambda: not runner.is_alive()):
        assert runner.is_alive(), f"the service stopped waiting for {what}"
        raise AssertionError(f"no {what} in {timeout_s} s")


def test_follow_mode_fires_deadlines_on_the_wall_clock_and_carries_on_after_a_stop(
        spark: Any, tmp_path: Path) -> None:
    import threading


    inbox, out, checkpoint = tmp_path / "in", tmp_path / "out", tmp_path / "ck"
    inbox.mkdir()

    def service() -> tuple[threading.Event, threading.Thread, list[Any]]:
        engine = SparkEngine(spark, inbox, out, checkpoint, lateness_ms=200, partitions=2,
                             dedupe_retention_ms=600_000, clock=wall_clock_ms)
        stop = threading.Event()
        results: list[Any] = []
        runner = threading.Thread(target=lambda: results.append(
            engine.follow(stop, trigger_ms=300)))
        runner.start()
        return stop, runner, results

    def watch(ts: int, op_id: str, deadline: int) -> str:
        return json.dumps({"ts_ms": ts, "type": "watch", "op_id": op_id, "keys": ["k"],
                           "deadline_ms": deadline, "condition": "any_update"})

    def resolved() -> dict[str, str]:
        return {o[0]: o[1] for o in outcomes_of(out)}

    stop, runner, results = service()
    try:
        now = wall_clock_ms()
        # Far enough ahead that the first micro-batch (Python workers starting) is
        # not late for them.
        _land(inbox, "a.jsonl", [watch(now, "soon", now + 3_000),
                                 watch(now, "later", now + 600_000)])
        # No row comes after the deadline: the clock alone expires it.
        _wait_until(lambda: "soon" in resolved(), "expiry", runner)
        _land(inbox, "b.jsonl", [json.dumps({"ts_ms": wall_clock_ms(), "type": "cancel",
                                             "op_id": "later"})])
        _wait_until(lambda: "later" in resolved(), "cancel", runner)
    finally:
        stop.set()
        runner.join(timeout=120)
    assert not runner.is_alive()
    assert resolved() == {"soon": "expired", "later": "cancelled"}
    assert results[0].pending == 0
    stop, runner, results = service()
    try:
        now = wall_clock_ms()
        _land(inbox, "c.jsonl", [watch(now, "after", now + 2_000)])
        _wait_until(lambda: "after" in resolved(), "expiry after the restart", runner)
    finally:
        stop.set()
        runner.join(timeout=120)
    assert not runner.is_alive()
    ids = [o[0] for o in outcomes_of(out)]
    assert sorted(ids) == ["after", "later", "soon"]  # nothing doubled
    expired = next(o for o in outcomes_of(out) if o[0] == "after")
    assert expired[2] == now + 2_000  # resolved at its deadline, in event time


def test_the_daylight_saving_rule_is_the_reference_engines(spark: Any, tmp_path: Path) -> None:
    # New York, 2026-11-01: a fixed time of day fires in the first pass of the repeated
    # hour, a frequent spec in both; 2026-03-08: times in the gap fire at its end.
    lines = []
    for day in ("2026-03-08", "2026-11-01"):
        start = round(datetime.fromisoformat(f"{day}T00:00:00+00:00").timestamp() * 1000)
        for sid, cron in (("fixed", "30 1 * * *"), ("gap", "30 2 * * *"),
                          ("quarter", "*/15 * * * *"), ("hourly", "0 * * * *")):
            lines.append(json.dumps({"ts_ms": start, "type": "schedule",
                                     "schedule_id": f"{sid}-{day}", "cron": cron,
                                     "tz": "America/New_York",
                                     "end_ms": start + 12 * 3_600_000}))
        lines += [json.dumps({"ts_ms": t, "type": "tick"})
                  for t in range(start, start + 13 * 3_600_000, 600_000)]
    write_files(lines, tmp_path / "in", files=2)
    expected = reference(tmp_path / "in")
    fired = {o.op_id for o in expected.outcomes}
    assert "quarantine-" not in fired and len(fired) > 90
    SparkEngine(spark, tmp_path / "in", tmp_path / "out", tmp_path / "ckpt",
                lateness_ms=LATENESS_MS, partitions=2).run()
    assert outcomes_of(tmp_path / "out") == expected_outcomes(expected)


def test_schedules_fire_on_the_wall_clock_once_each_across_a_stop(spark: Any,
                                                                   tmp_path: Path) -> None:
    import threading


    inbox, out, checkpoint = tmp_path / "in", tmp_path / "out", tmp_path / "ck"
    inbox.mkdir()

    def service() -> tuple[threading.Event, threading.Thread]:
        engine = SparkEngine(spark, inbox, out, checkpoint, lateness_ms=200, partitions=2,
                             clock=wall_clock_ms)
        stop = threading.Event()
        runner = threading.Thread(target=lambda: engine.follow(stop, trigger_ms=300))
        runner.start()
        return stop, runner

    def fired() -> list[str]:
        return [o[0] for o in outcomes_of(out) if o[1] == "fired"]

    stop, runner = service()
    try:
        now = wall_clock_ms()
        _land(inbox, "a.jsonl", [json.dumps(
            {"ts_ms": now, "type": "schedule", "schedule_id": f"s{n}", "every_ms": 500,
             "misfire": "all"}) for n in range(3)])
        _wait_until(lambda: len(fired()) >= 9, "three fires of each schedule", runner)
    finally:
        stop.set()
        runner.join(timeout=120)
    assert not runner.is_alive()
    stopped = len(fired())
    stop, runner = service()  # the occurrences of the stop fire once, by "all"
    try:
        _wait_until(lambda: len(fired()) >= stopped + 9, "fires after the restart", runner)
    finally:
        stop.set()
        runner.join(timeout=120)
    ids = fired()
    assert len(ids) == len(set(ids))
    for n in range(3):  # no occurrence lost either: each series runs on without a gap
        times = sorted(int(i.split("@")[1]) for i in ids if i.startswith(f"s{n}@"))
        assert times == list(range(times[0], times[-1] + 1, 500))


def test_in_event_time_a_gap_is_caught_up_in_bounded_micro_batches_without_new_input(
        spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """After a gap in the log, each op partition fires a bounded share of the catch-up a
    micro-batch, the driver starts the next without input, and a stop in the middle
    goes on after a restart: the reference engine's outcomes, each once."""
    import threading

    from tickwheel.pipeline.engines.reference import ReferenceEngine
    from tickwheel.pipeline.spark import engine as spark_engine

    monkeypatch.setattr(spark_engine, "OCCURRENCES_PER_BATCH", 500)
    inbox, out, checkpoint = tmp_path / "in", tmp_path / "out", tmp_path / "ck"
    inbox.mkdir()
    first = [json.dumps({"ts_ms": 1_000, "type": "schedule", "schedule_id": f"s{n}",
                         "every_ms": 1_000, "misfire": "all"}) for n in range(60)]
    first.append(json.dumps({"ts_ms": 1_500, "type": "tick"}))
    # The log's next rows come 100 s later: 60 x 99 occurrences in the gap.
    then = [json.dumps({"ts_ms": ts, "type": "tick"}) for ts in (101_000, 101_400, 101_600)]
    uninterrupted = ReferenceEngine(lateness_ms=100)
    uninterrupted.feed_lines([*first, *then])
    expected = expected_outcomes(uninterrupted.run())
    assert len(expected) > 60 * 95
    sizes: list[int] = []

    def service(stop_after: int | None) -> tuple[threading.Event, threading.Thread]:
        stop = threading.Event()

        def counted(batch_id: int, outcomes: int, quarantined: int) -> None:
            sizes.append(outcomes)
            if stop_after is not None and sum(sizes) >= stop_after:
                stop.set()  # in the middle of the catch-up

        engine = SparkEngine(spark, inbox, out, checkpoint, lateness_ms=100, partitions=2,
                             on_batch=counted)
        runner = threading.Thread(target=lambda: engine.follow(stop, trigger_ms=200))
        runner.start()
        return stop, runner

    _land(inbox, "a.jsonl", first)
    _land(inbox, "b.jsonl", then)
    stop, runner = service(stop_after=1_000)
    try:
        _wait_until(stop.is_set, "a part of the catch-up", runner)
    finally:
        stop.set()
        runner.join(timeout=120)
    assert not runner.is_alive()
    assert 1_000 <= len(outcomes_of(out)) < len(expected)
    stop, runner = service(stop_after=None)  # nothing new lands: it goes on by itself
    try:
        _wait_until(lambda: len(outcomes_of(out)) >= len(expected), "the whole catch-up",
                    runner)
    finally:
        stop.set()
        runner.join(timeout=120)
    assert not runner.is_alive()
    assert outcomes_of(out) == expected
    assert len([n for n in sizes if n]) >= 6
    assert max(sizes) <= 2 * (500 + 60)  # a share a partition, a series' plan whole


def test_a_batch_run_decides_a_gaps_catch_up_in_bounded_micro_batches(
        spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run over a log with a gap, with or without ending the input, fires a bounded
    share of the catch-up a partition a micro-batch until it is over: the reference
    engine's outcomes, each once, and no micro-batch holds the whole gap."""
    from tickwheel.pipeline.engines.reference import ReferenceEngine
    from tickwheel.pipeline.spark import engine as spark_engine

    monkeypatch.setattr(spark_engine, "OCCURRENCES_PER_BATCH", 500)
    inbox, out, checkpoint = tmp_path / "in", tmp_path / "out", tmp_path / "ck"
    inbox.mkdir()
    lines = [json.dumps({"ts_ms": 1_000, "type": "schedule", "schedule_id": f"s{n}",
                         "every_ms": 1_000, "misfire": "all"}) for n in range(60)]
    # One file: the schedules, then rows 100 s later (60 x 99 occurrences in the gap).
    lines += [json.dumps({"ts_ms": ts, "type": "tick"})
              for ts in (1_500, 101_000, 101_400, 101_600)]
    reference = ReferenceEngine(lateness_ms=100)
    reference.feed_lines(lines)
    expected = expected_outcomes(reference.run())
    _land(inbox, "a.jsonl", lines)
    sizes: list[int] = []
    engine = SparkEngine(spark, inbox, out, checkpoint, lateness_ms=100, partitions=2,
                         on_batch=lambda batch_id, outcomes, quarantined: sizes.append(outcomes))

    first = engine.run(final=False)  # up to the last row less the lateness bound
    assert not any(s.catching_up for s in first.partitions)
    assert len(outcomes_of(out)) >= 60 * 99
    assert len([n for n in sizes if n]) >= 6
    done = engine.run(final=True)
    assert (done.held, done.rows_in) == (0, len(lines))
    assert outcomes_of(out) == expected
    assert max(sizes) <= 2 * (500 + 60)  # a share a partition, a series' plan whole


def test_a_wall_clock_checkpoint_runs_in_follow_mode_only(spark: Any, tmp_path: Path) -> None:
    (tmp_path / "in").mkdir()
    engine = SparkEngine(spark, tmp_path / "in", tmp_path / "out", tmp_path / "ck",
                         partitions=1, clock=wall_clock_ms)
    with pytest.raises(ValueError, match="follow mode only"):
        engine.run()
    with pytest.raises(ValueError, match="clock=event but the checkpoint"):
        SparkEngine(spark, tmp_path / "in", tmp_path / "out", tmp_path / "ck")


def test_follow_mode_on_both_engines_gives_equal_outcomes_for_files_fed_while_running(
        spark: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    import threading

    from tickwheel.pipeline.engines.follow import LocalFollowEngine

    lines = random_log(21, rows=2_000)
    parts = [lines[i:i + 400] for i in range(0, len(lines), 400)]
    inbox = tmp_path / "in"
    inbox.mkdir()
    engine = SparkEngine(spark, inbox, tmp_path / "out", tmp_path / "ck",
                         lateness_ms=LATENESS_MS, partitions=2, dedupe_retention_ms=60_000)
    stop = threading.Event()
    runner = threading.Thread(target=lambda: engine.follow(stop, trigger_ms=200))
    runner.start()
    try:
        landed = 0
        for n, part in enumerate(parts):
            if n == 2:  # the streaming source lists it: the driver tells of it
                (inbox / "part-9.jsonl").symlink_to(tmp_path / "nowhere.jsonl")
            with caplog.at_level("WARNING", logger="tickwheel.pipeline.spark.engine"):
                _land(inbox, f"part-{n}.jsonl", part)
                landed += len(part)
                _wait_until(lambda rows=landed: engine.result().rows_in >= rows,
                            "the file's rows", runner)
    finally:
        stop.set()
        runner.join(timeout=120)
    assert not runner.is_alive()
    assert engine.result().files_skipped == 1
    assert [r.getMessage() for r in caplog.records].count(
        f"skipping input file {str(inbox / 'part-9.jsonl')!r}: a symlink that leads to "
        "no file") == 1
    local = LocalFollowEngine(inbox, tmp_path / "local", lateness_ms=LATENESS_MS,
                              dedupe_retention_ms=60_000)
    local.step()
    assert outcomes_of(tmp_path / "out") == outcomes_of(tmp_path / "local")
    assert quarantine_of(tmp_path / "out") == quarantine_of(tmp_path / "local")
    assert len(outcomes_of(tmp_path / "out")) > 100


def test_a_follow_service_killed_hard_and_restarted_gives_the_outcomes_of_one_run(
        tmp_path: Path) -> None:
    """kill -9 of the whole service (driver, JVM, workers) in the middle of its
    micro-batches, then SIGTERM after a restart: the outcomes of one uninterrupted
    pass over the same files."""
    from tickwheel.pipeline.engines.follow import LocalFollowEngine

    lines = random_log(31, rows=3_000)
    parts = [lines[i:i + 300] for i in range(0, len(lines), 300)]
    inbox, out = tmp_path / "in", tmp_path / "out"
    inbox.mkdir()
    # A killed JVM cannot remove its scratch directories: they go under tmp_path.
    (tmp_path / "java-tmp").mkdir()
    command = [sys.executable, "-m", "tickwheel.cli", "run", "--follow", "--engine", "spark",
               "--master", "local[2]", "--partitions", "2", "--input", str(inbox),
               "--output", str(out), "--lateness-ms", str(LATENESS_MS), "--trigger-ms", "200",
               "--conf", f"spark.local.dir={tmp_path / 'spark-local'}",
               "--conf", f"spark.driver.extraJavaOptions=-Djava.io.tmpdir={tmp_path / 'java-tmp'}"]
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"}

    def start() -> subprocess.Popen[str]:
        return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, env=env, start_new_session=True)

    child = start()
    try:
        for n, part in enumerate(parts[:5]):
            _land(inbox, f"part-{n}.jsonl", part)
        wait_for(lambda: committed_batches(out / "_checkpoint") >= 1, "a micro-batch", child,
                 240)
        for n, part in enumerate(parts[5:8], start=5):
            _land(inbox, f"part-{n}.jsonl", part)
        time.sleep(0.5)  # likely in the middle of a micro-batch
    finally:
        os.killpg(child.pid, signal.SIGKILL)
        child.communicate(timeout=60)
    for n, part in enumerate(parts[8:], start=8):
        _land(inbox, f"part-{n}.jsonl", part)
    child = start()
    engine_rows = len(lines)
    try:
        wait_for(lambda: spark_rows_in(out) >= engine_rows, "every row", child, 240)
        child.send_signal(signal.SIGTERM)
        output, errors = child.communicate(timeout=180)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signal.SIGKILL)
    assert child.returncode == 0, errors
    # The command's own output only: what Spark and PySpark's workers print goes to
    # the log, which shows errors only.
    assert "Python worker" not in output + errors, output + errors
    assert "log4j" not in errors, errors
    local = LocalFollowEngine(inbox, tmp_path / "local", lateness_ms=LATENESS_MS)
    local.step()
    assert outcomes_of(out) == outcomes_of(tmp_path / "local")
    assert quarantine_of(out) == quarantine_of(tmp_path / "local")


def test_the_seen_op_ids_segments_past_the_retention_leave_spark_state_whole(
        spark: Any, tmp_path: Path) -> None:
    """An op partition writes the ids each batch sees as a segment of its own, and
    removes a segment once every id in it is past the retention: here three batches of
    a log whose ids mostly pass their retention of 1 s, after which Spark's state holds
    the last batch's segment, read back with its newest ids."""
    log, retention = tmp_path / "in", 1_000
    write_event_log(GeneratorConfig(events=150_000, seed=11, rows_per_file=50_000), log)
    expected = reference(log, retention)
    engine = SparkEngine(spark, log, tmp_path / "out", tmp_path / "ckpt",
                         lateness_ms=LATENESS_MS, partitions=2, max_files_per_trigger=1,
                         dedupe_retention_ms=retention)
    result = engine.run()
    assert outcomes_of(tmp_path / "out") == expected_outcomes(expected)
    assert quarantine_of(tmp_path / "out") == expected_quarantine(expected)
    assert result.pending == expected.pending

    watched: list[dict[str, int]] = [{}, {}]  # each id's first watch
    for event in read_events(log):
        if isinstance(event, Event) and event.type.value == "watch" and event.op_id:
            watched[partition_of(event.op_id, 2)].setdefault(event.op_id, event.ts_ms)
    # Spark's own state reader. Spark numbers the stateful operators from the output
    # down, so stage 2, the last, is operator 0.
    rows = (spark.read.format("statestore").option("operatorId", 0)
            .option("stateVarName", "seen").load(str(tmp_path / "ckpt" / "query"))
            .collect())
    stored: dict[int, list[tuple[int, SeenSegment]]] = {}
    for row in rows:
        value = row["user_map_value"]
        stored.setdefault(engine.labels.index(row["key"][0]), []).append(
            (row["user_map_key"][0], SeenSegment(value[0], value[1], value[2])))
    assert sorted(stored) == [0, 1]
    for p, segments in stored.items():
        assert len(segments) <= 2  # of three batches' (or four, with the input's end)
        ids = SeenLog.read(segments, max(number for number, _ in segments) + 1).ids
        assert ids.items() <= watched[p].items()
        assert len(ids) < len(watched[p]) / 2
        newest = max(watched[p].values())
        assert {i for i, ts in watched[p].items() if ts == newest} <= ids.keys()


def test_a_micro_batch_run_again_replaces_every_file_its_first_attempt_wrote(
        spark: Any, tmp_path: Path) -> None:
    log = tmp_path / "in"
    write_files(random_log(5), log, files=2)
    expected = reference(log)
    SparkEngine(spark, log, tmp_path / "out", tmp_path / "ckpt", lateness_ms=LATENESS_MS,
                partitions=2).run()
    outcomes = tmp_path / "out" / "outcomes"
    # As if the first attempt had a partition that wrote outcomes this attempt will not
    # (its input changed before the restart), and the query died before its commit.
    shutil.copy(outcomes / "batch-000000000-00000.parquet",
                outcomes / "batch-000000000-00007.parquet")
    for name in ("0", ".0.crc"):  # the commit, and Hadoop's checksum beside it
        (tmp_path / "ckpt" / "query" / "commits" / name).unlink(missing_ok=True)
    SparkEngine(spark, log, tmp_path / "out", tmp_path / "ckpt", lateness_ms=LATENESS_MS).run()
    assert not (outcomes / "batch-000000000-00007.parquet").exists()
    assert outcomes_of(tmp_path / "out") == expected_outcomes(expected)


UI_SESSION = """
import os, sys, time
from tickwheel.pipeline.spark import spark_session
spark = spark_session("local[1]", settings={"spark.ui.enabled": "true", "spark.ui.port": "0"})
print(spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid(), flush=True)
print(os.environ.get("SPARK_LOCAL_IP"), flush=True)
sys.stdin.readline()
"""


@pytest.mark.spark
def test_a_local_masters_ui_asked_for_listens_on_loopback_only(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "SPARK_LOCAL_IP"}
    env["JAVA_TOOL_OPTIONS"] = _java_options(f"-Djava.io.tmpdir={tmp_path}")
    child = subprocess.Popen([sys.executable, "-c", UI_SESSION], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True, env=env, cwd=tmp_path)
    try:
        assert child.stdout is not None and child.stdin is not None
        pid = int(child.stdout.readline())
        assert child.stdout.readline().strip() == "None"  # set for the launch only
        addresses = _listening(pid)
        assert len(addresses) >= 3, addresses  # RPC, block manager and the UI
        assert all(_is_loopback(a) for a in addresses), addresses
        child.stdin.write("\n")
        child.stdin.flush()
        child.wait(timeout=120)
    finally:
        child.kill()
        child.wait()


@contextlib.contextmanager
def _following(engine: SparkEngine, trigger_ms: int) -> Any:
    """The engine in follow mode on a thread of its own while the block runs; the
    thread is yielded (for _wait_until), and stopped between micro-batches after."""
    import threading

    stop = threading.Event()
    runner = threading.Thread(target=lambda: engine.follow(stop, trigger_ms=trigger_ms))
    runner.start()
    try:
        yield runner
    finally:
        stop.set()
        runner.join(timeout=120)
    assert not runner.is_alive()


@pytest.mark.spark
def test_follow_mode_quarantines_a_row_too_far_ahead_of_the_wall_clock(
        spark: Any, tmp_path: Path) -> None:

    inbox, out = tmp_path / "in", tmp_path / "out"
    inbox.mkdir()
    engine = SparkEngine(spark, inbox, out, tmp_path / "ck", lateness_ms=200, partitions=2,
                         clock=wall_clock_ms, max_future_ms=60_000)

    def row(ts: int, op_id: str, deadline: int) -> str:
        return json.dumps({"ts_ms": ts, "type": "watch", "op_id": op_id, "keys": ["k"],
                           "deadline_ms": deadline, "condition": "any_update"})

    with _following(engine, 300) as runner:
        now = wall_clock_ms()
        _land(inbox, "a.jsonl", [row(now, "soon", now + 3_000),
                                 row(now, "pending", now + 600_000),
                                 row(now + 10**12, "far", now + 10**12 + 1),
                                 json.dumps({"ts_ms": now + 10**12, "type": "update",
                                             "key": "k", "value": 1})])
        _wait_until(lambda: len(quarantine_of(out)) == 2 and len(outcomes_of(out)) == 1,
                    "the quarantine and the expiry", runner)
    assert [q[0] for q in quarantine_of(out)] == ["future", "future"]
    # Time stayed with the clock: the far rows expired nothing and completed nothing.
    assert {o[0]: o[1] for o in outcomes_of(out)} == {"soon": "expired"}


@pytest.mark.spark
def test_a_checkpoint_of_another_input_directory_is_refused_naming_both(
        spark: Any, tmp_path: Path) -> None:
    (tmp_path / "in").mkdir()
    (tmp_path / "elsewhere").mkdir()
    SparkEngine(spark, tmp_path / "in", tmp_path / "out", tmp_path / "ck", partitions=1)
    # The same directory spelled another way is the same input.
    SparkEngine(spark, tmp_path / "in" / ".." / "in", tmp_path / "out", tmp_path / "ck")
    with pytest.raises(ValueError, match=rf"reads the input {tmp_path / 'in'}, not "
                                         rf"{tmp_path / 'elsewhere'}"):
        SparkEngine(spark, tmp_path / "elsewhere", tmp_path / "out", tmp_path / "ck")


@pytest.mark.spark
def test_follow_mode_reads_a_file_deleted_and_written_again_under_its_name(
        spark: Any, tmp_path: Path) -> None:

    inbox, out = tmp_path / "in", tmp_path / "out"
    inbox.mkdir()
    engine = SparkEngine(spark, inbox, out, tmp_path / "ck", lateness_ms=200, partitions=1,
                         clock=wall_clock_ms)

    def watch(op_id: str) -> str:
        now = wall_clock_ms()
        return json.dumps({"ts_ms": now, "type": "watch", "op_id": op_id, "keys": [],
                           "deadline_ms": now + 1_000, "condition": "none"})

    with _following(engine, 200) as runner:
        _land(inbox, "b.jsonl", [watch("first")])
        _wait_until(lambda: "first" in {o[0] for o in outcomes_of(out)}, "first", runner)
        (inbox / "b.jsonl").unlink()
        listed = engine.batches
        _wait_until(lambda: engine.batches >= listed + 3, "listings without it", runner)
        _land(inbox, "b.jsonl", [watch("second")])
        _wait_until(lambda: "second" in {o[0] for o in outcomes_of(out)}, "second", runner)
    assert sorted(o[0] for o in outcomes_of(out)) == ["first", "second"]
