"""The tickwheel command: generate, run, report, and its errors."""

from __future__ import annotations

import bz2
import json
import os
import socket
import subprocess
import sys
import tracemalloc
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from tickwheel.cli import app
from tickwheel.pipeline.contract.events import (
    MAX_ROW_CHARS,
    TOO_LONG_KEPT_CHARS,
    Quarantined,
    Reason,
)
from tickwheel.pipeline.engines.reference import ReferenceEngine
from tickwheel.pipeline.io.input_dir import INPUT_NAMES
from tickwheel.pipeline.io.log_reader import parquet_events
from tickwheel.pipeline.io.outputs import read_parquet_rows

runner = CliRunner()


def test_generate_run_report(tmp_path: Path) -> None:
    events, out = tmp_path / "events", tmp_path / "out"
    result = runner.invoke(app, ["generate", "--events", "8000", "--output", str(events),
                                 "--malformed", "0.01", "--rows-per-file", "3000"])
    assert result.exit_code == 0, result.output
    assert len(list(events.glob("*.jsonl"))) == 3
    result = runner.invoke(app, ["run", "--engine", "local", "--input", str(events),
                                 "--output", str(out)])
    assert result.exit_code == 0, result.output
    assert "rows quarantined" in result.output
    outcomes = read_parquet_rows(out / "outcomes")
    quarantine = read_parquet_rows(out / "quarantine")
    assert len(quarantine) == 80 and {q["reason"] for q in quarantine} <= {
        "unparseable", "missing_field", "bad_type", "unknown_type", "unknown_condition",
        "value_and_error", "duplicate_field"}
    assert outcomes and set(outcomes[0]) == {"op_id", "outcome", "resolved_ms", "latency_ms",
                                             "keys", "error", "skipped", "target",
                                             "payload"}
    assert all((o["error"] is None) == (o["outcome"] != "error") for o in outcomes)
    result = runner.invoke(app, ["report", "--output", str(out)])
    assert result.exit_code == 0, result.output
    assert "produce" in result.output and "quarantined rows" in result.output
    assert "unparseable" in result.output
    assert (out / "report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_report_without_quarantined_rows_says_none(tmp_path: Path) -> None:
    events, out = tmp_path / "events", tmp_path / "out"
    assert runner.invoke(app, ["generate", "--events", "2000", "--output",
                               str(events)]).exit_code == 0
    assert runner.invoke(app, ["run", "--input", str(events), "--output",
                               str(out)]).exit_code == 0
    result = runner.invoke(app, ["report", "--output", str(out)])
    assert result.exit_code == 0, result.output
    assert "quarantined rows: none" in result.output


def test_a_directory_named_with_a_byte_that_is_not_utf8_and_plot_markup_is_reported(
        tmp_path: Path) -> None:
    # pyarrow takes a path as UTF-8, matplotlib reads "$...$" in a title as math, and a
    # strict UTF-8 stdout cannot print the name: the command prints the byte as it was.
    plain = tmp_path / "events"
    assert runner.invoke(app, ["generate", "--events", "500", "--output",
                               str(plain)]).exit_code == 0
    odd = tmp_path / os.fsdecode(b"s\xffu $\\frac{$ \t")
    events, out = odd / "events", odd / "out"
    events.mkdir(parents=True)
    for file in plain.iterdir():
        (events / file.name).write_bytes(file.read_bytes())
    env = {**os.environ, "PYTHONIOENCODING": "utf-8"}
    for args in (["run", "--input", events, "--output", out], ["report", "--output", out]):
        done = subprocess.run([sys.executable, "-m", "tickwheel.cli", *map(str, args)],
                              capture_output=True, env=env, timeout=300, check=False)
        assert done.returncode == 0, done.stderr.decode(errors="replace")
    assert b"produce" in done.stdout
    assert b"plot: " + os.fsencode(tmp_path) + b"/s\xffu $\\frac{$" in done.stdout
    assert (out / "report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_parquet_input_resolves_like_json_lines(tmp_path: Path) -> None:
    rows = [
        {"ts_ms": 1000, "type": "watch", "op_id": "p-1", "keys": ["a"], "deadline_ms": 5000,
         "condition": "all_at_least", "targets": {"a": 3}},
        {"ts_ms": 1001, "type": "update", "key": "a", "value": 3},
        {"ts_ms": 1002, "type": "watch", "op_id": "t-1", "keys": [], "deadline_ms": 1500,
         "condition": "none"},
        {"ts_ms": 2000, "type": "tick"},
    ]
    jsonl, parquet = tmp_path / "jsonl", tmp_path / "parquet"
    jsonl.mkdir()
    parquet.mkdir()
    (jsonl / "a.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    (jsonl / "_ignored.jsonl").write_text("not even json\n")  # `_` names are not input
    table = pa.table({
        "ts_ms": pa.array([r["ts_ms"] for r in rows], pa.int64()),
        "type": pa.array([r["type"] for r in rows]),
        "op_id": pa.array([r.get("op_id") for r in rows]),
        "keys": pa.array([r.get("keys") for r in rows], pa.list_(pa.string())),
        "deadline_ms": pa.array([r.get("deadline_ms") for r in rows], pa.int64()),
        "condition": pa.array([r.get("condition") for r in rows]),
        "targets": pa.array([list(r["targets"].items()) if "targets" in r else None
                             for r in rows], pa.map_(pa.string(), pa.int64())),
        "key": pa.array([r.get("key") for r in rows]),
        "value": pa.array([r.get("value") for r in rows], pa.int64()),
    })
    pq.write_table(table, parquet / "a.parquet")
    results = []
    for source in (jsonl, parquet):
        out = tmp_path / f"out-{source.name}"
        result = runner.invoke(app, ["run", "--input", str(source), "--output", str(out)])
        assert result.exit_code == 0, result.output
        results.append(sorted(read_parquet_rows(out / "outcomes"), key=lambda o: o["op_id"]))
    assert results[0] == results[1]
    assert [(o["op_id"], o["outcome"]) for o in results[0]] == [("p-1", "completed"),
                                                                ("t-1", "expired")]


@pytest.mark.parametrize("args", [
    ["run", "--input", "/no/such/dir", "--output", "/tmp/x"],
    ["run", "--engine", "spark", "--input", "/no/such/dir", "--output", "/tmp/x"],
    ["run", "--input", ".", "--output", "/tmp/x", "--partitions", "2"],
    ["run", "--engine", "spark", "--input", ".", "--output", "/tmp/x", "--partitions", "0"],
    ["run", "--engine", "flink", "--input", ".", "--output", "/tmp/x"],
    ["generate", "--events", "0", "--output", "/tmp/x"],
    ["report", "--output", "/no/such/dir"],
    # Beyond what Spark takes (a watermark delay past a long of microseconds, an int of
    # files): refused before either engine writes anything.
    ["run", "--input", ".", "--output", "/tmp/x", "--lateness-ms", "9223372036854775807"],
    ["run", "--engine", "spark", "--input", ".", "--output", "/tmp/x",
     "--lateness-ms", "9223372036854775807"],
    ["run", "--engine", "spark", "--input", ".", "--output", "/tmp/x", "--partitions", "100000"],
    ["run", "--engine", "spark", "--input", ".", "--output", "/tmp/x",
     "--max-files-per-trigger", "2147483648"],
    ["run", "--input", ".", "--output", "/tmp/x", "--dedupe-retention-ms",
     "9223372036854775808"],
    # Follow mode's options, and only with --follow.
    ["run", "--input", ".", "--output", "/tmp/x", "--clock", "wall"],
    ["run", "--input", ".", "--output", "/tmp/x", "--follow", "--trigger-ms", "0"],
    ["run", "--input", ".", "--output", "/tmp/x", "--follow", "--clock", "sundial"],
    ["run", "--input", ".", "--output", "/tmp/x", "--follow", "--no-final"],
    ["run", "--input", ".", "--output", "/tmp/x", "--follow", "--partitions", "2"],
    ["run", "--input", "/no/such/dir", "--output", "/tmp/x", "--follow"],
    ["run", "--input", ".", "--output", "/tmp/x", "--follow", "--metrics-port", "70000"],
    ["generate", "--output", "/tmp/x", "--follow", "--rate", "10"],
    ["generate", "--output", "/tmp/x", "--follow", "--file-ms", "0"],
    # A processor that cannot be loaded or is not one: refused before any work.
    ["run", "--input", ".", "--output", "/tmp/x", "--processor", "no_colon"],
    ["run", "--input", ".", "--output", "/tmp/x", "--processor", "no_such_module_xyz:P"],
    ["run", "--input", ".", "--output", "/tmp/x", "--processor", "tickwheel:NoSuchName"],
    ["run", "--input", ".", "--output", "/tmp/x", "--processor", "builtins:int"],
    ["run", "--engine", "spark", "--input", ".", "--output", "/tmp/x", "--processor", ":"],
    # The driver's memory is the Spark engine's, and Spark's format.
    ["run", "--input", ".", "--output", "/tmp/x", "--driver-memory", "1g"],
    ["run", "--input", ".", "--output", "/tmp/x", "--follow", "--driver-memory", "1g"],
    ["run", "--engine", "spark", "--input", ".", "--output", "/tmp/x", "--driver-memory",
     "lots"],
    # Spark settings are the Spark engine's, and checked before it starts.
    ["run", "--input", ".", "--output", "/tmp/x", "--conf", "spark.executor.memory=2g"],
    ["run", "--input", ".", "--output", "/tmp/x", "--follow", "--conf", "spark.a=1"],
    ["run", "--engine", "spark", "--input", ".", "--output", "/tmp/x", "--conf", "spark.x"],
])
def test_bad_arguments_exit_2(args: list[str]) -> None:
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    assert not Path("/tmp/x/_checkpoint").exists() or "spark" not in args


@pytest.mark.parametrize("engine", ["local", "spark"])
def test_a_metrics_endpoint_that_cannot_be_served_is_refused_before_any_work(
        tmp_path: Path, engine: str) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        for host in ("127.0.0.1", "192.0.2.1"):  # a port in use; an address not ours
            result = runner.invoke(app, [
                "run", "--engine", engine, "--follow", "--input", str(tmp_path), "--output",
                str(tmp_path / "out"), "--metrics-port", str(port), "--metrics-host", host,
                "--insecure-no-auth"])
            assert result.exit_code == 2, result.output
            assert f"--metrics-host {host} --metrics-port {port}: cannot serve" in result.output
            assert not (tmp_path / "out").exists()


def test_a_metrics_endpoint_beyond_loopback_needs_insecure_no_auth(tmp_path: Path) -> None:
    result = runner.invoke(app, [
        "run", "--follow", "--input", str(tmp_path), "--output", str(tmp_path / "out"),
        "--metrics-port", "0", "--metrics-host", "0.0.0.0"])
    assert result.exit_code == 2, result.output
    assert "--metrics-host 0.0.0.0 is beyond loopback" in result.output
    assert "--insecure-no-auth" in result.output
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("option", "value", "reason"), [
    ("--driver-memory", "2 g", "a whole number and a unit"),
    ("--driver-memory", "1.5g", "a whole number and a unit"),
    ("--driver-memory", "4096", "a whole number and a unit"),
    ("--driver-memory", "\udcff1g", "a whole number and a unit"),
    ("--driver-memory", "99999999999999g", "a whole number and a unit"),
    ("--driver-memory", "449m", "at least 450m"),
    ("--driver-memory", "460799k", "at least 450m"),
    ("--conf", "spark.executor.memory", "is KEY=VALUE"),
    ("--conf", "=2g", "is KEY=VALUE"),
    ("--conf", "executor.memory=2g", "'executor.memory' is not a Spark setting"),
    ("--conf", "spark.=1", "'spark.' is not a Spark setting"),
    ("--conf", "spark.master=yarn", "spark.master cannot be set here; use --master"),
    ("--conf", "spark.driver.memory=8g", "use --driver-memory"),
    ("--conf", "spark.sql.streaming.stateStore.providerClass=x",
     "needs RocksDB's state store"),
])
def test_a_spark_setting_spark_would_refuse_is_refused_by_name(option: str, value: str,
                                                               reason: str) -> None:
    result = runner.invoke(app, ["run", "--engine", "spark", "--input", ".", "--output",
                                 "/tmp/x", option, value])
    assert result.exit_code == 2, result.output
    text = " ".join(result.output.replace("│", " ").split())  # as wrapped in its box
    assert option in text and reason in text, result.output


@pytest.mark.parametrize("follow", [[], ["--follow"], ["--engine", "spark"]])
def test_an_input_that_is_not_a_directory_is_refused_saying_what_it_is(
        tmp_path: Path, follow: list[str]) -> None:
    log = tmp_path / "events.jsonl"
    log.write_text("")
    (tmp_path / "dangling").symlink_to(tmp_path / "gone")
    for given, said in ((log, f"input {log} is not a directory"),
                        (tmp_path / "dangling", "is a symlink to nothing"),
                        (tmp_path / "absent", "input directory")):
        result = runner.invoke(app, ["run", "--input", str(given), "--output",
                                     str(tmp_path / "out"), *follow])
        assert result.exit_code == 2, result.output
        text = " ".join(result.output.replace("│", " ").split())
        assert said in text, result.output
        assert not (tmp_path / "out").exists()


def test_a_service_that_cannot_write_stops_in_one_line_with_exit_1(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A full disk, or the output taken away under it: said, not a traceback.
    from tickwheel.pipeline.engines.follow import LocalFollowEngine

    def full(self: LocalFollowEngine) -> None:
        raise OSError(28, "No space left on device", str(tmp_path / "out" / "x"))

    monkeypatch.setattr(LocalFollowEngine, "step", full)
    (tmp_path / "in").mkdir()
    result = runner.invoke(app, ["run", "--follow", "--input", str(tmp_path / "in"),
                                 "--output", str(tmp_path / "out")])
    assert result.exit_code == 1, result.output
    text = " ".join(result.output.split())
    assert "the service stopped in batch 0: [Errno 28] No space left on device" in text
    assert "Traceback" not in result.output


@pytest.mark.parametrize("name", ["[/x]", "[bold]b[/bold]", "tickwheel[spark]"])
def test_brackets_in_a_path_are_printed_as_they_are(tmp_path: Path, name: str) -> None:
    # rich would read them as its own markup: dropped, or an error of its own.
    given = tmp_path / name
    result = runner.invoke(app, ["run", "--input", str(given), "--output",
                                 str(tmp_path / "out")])
    assert result.exit_code == 2, result.output
    assert f"input directory {given} does not exist" in " ".join(result.output.split())


def test_generate_refuses_an_output_that_is_a_file(tmp_path: Path) -> None:
    target = tmp_path / "events.jsonl"
    target.write_text("keep me\n")
    result = runner.invoke(app, ["generate", "--events", "10", "--output", str(target)])
    assert result.exit_code == 2 and "not a directory" in result.output
    assert target.read_text() == "keep me\n"


def test_generate_refuses_a_directory_that_holds_a_log_already(tmp_path: Path) -> None:
    # Regenerating a smaller log over a larger one would leave a mix of both.
    target = tmp_path / "events"
    assert runner.invoke(app, ["generate", "--events", "300", "--rows-per-file", "100",
                               "--output", str(target)]).exit_code == 0
    before = {p.name: p.read_bytes() for p in target.iterdir()}
    result = runner.invoke(app, ["generate", "--events", "100", "--seed", "2",
                                 "--output", str(target)])
    assert result.exit_code == 2 and "already holds 3 input files" in result.output
    assert {p.name: p.read_bytes() for p in target.iterdir()} == before
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / ".hidden.jsonl.tmp").write_text("")
    assert runner.invoke(app, ["generate", "--events", "10", "--output",
                               str(tmp_path / "other")]).exit_code == 0


def test_the_module_names_every_benchmark_and_each_has_its_help(
        capsys: pytest.CaptureFixture[str]) -> None:
    from benchmarks import BENCHMARKS
    from benchmarks.__main__ import main as bench_main

    with pytest.raises(SystemExit):
        bench_main(["--help"])
    usage = capsys.readouterr().out
    listed = usage[usage.index("{") + 1:usage.index("}")].split(",")
    assert tuple(listed) == BENCHMARKS
    for name in BENCHMARKS:
        with pytest.raises(SystemExit) as done:
            bench_main([name, "--help"])
        assert done.value.code == 0
        assert f"python -m benchmarks {name}" in " ".join(capsys.readouterr().out.split())


def test_a_benchmark_that_is_not_one_is_refused() -> None:
    from benchmarks.__main__ import main as bench_main

    with pytest.raises(SystemExit) as done:
        bench_main(["sorting"])
    assert done.value.code == 2


@pytest.mark.parametrize("command", ["generate", "run"])
def test_a_closed_standard_output_stops_the_printing_not_the_work(
        tmp_path: Path, command: str) -> None:
    # As with | head: every write to stdout fails (EPIPE) from the start. The work is
    # done first, and only the lines after it are lost.
    source = _generated(tmp_path, events=500)
    out = tmp_path / "out"
    args = (["run", "--input", str(source), "--output", str(out)] if command == "run"
            else ["generate", "--events", "500", "--output", str(out)])
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        result = subprocess.run([sys.executable, "-m", "tickwheel.cli", *args],
                                stdout=write_end, stderr=subprocess.PIPE, text=True,
                                timeout=120, check=False)
    finally:
        os.close(write_end)
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    written = out / "outcomes" / "part-00000.parquet" if command == "run" \
        else out / "events-00001.jsonl"
    assert written.exists()


def test_version_names_the_release_and_the_build() -> None:
    import tickwheel

    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0, result.output
    assert f"tickwheel {tickwheel.__version__} on Python" in result.output
    assert ("core: compiled" if tickwheel.compiled else "core: pure Python") in result.output


@pytest.mark.parametrize("command", ["generate", "run", "report", "serve", "schedules",
                                     "ops", "submit"])
def test_help_everywhere(command: str) -> None:
    result = runner.invoke(app, [command, "--help"])
    assert result.exit_code == 0 and "Usage" in result.output


@pytest.mark.spark
def test_both_engines_write_the_same_outputs(spark: object, tmp_path: Path) -> None:
    events = tmp_path / "events"
    assert runner.invoke(app, ["generate", "--events", "3000", "--malformed", "0.01",
                               "--rows-per-file", "1000", "--output", str(events)]).exit_code == 0
    # Symlinks: one leaves the input directory (skipped by both), one stays in it (read).
    (tmp_path / "secret.jsonl").write_text("root:x:0:0\n")
    (events / "zz-out.jsonl").symlink_to(tmp_path / "secret.jsonl")
    (events / "zz-in.jsonl").symlink_to(events / "events-00001.jsonl")
    with (events / "events-00002.jsonl").open("a") as log:
        log.write('{"ts_ms": 1, "type": "tick", "pad": "' + "x" * MAX_ROW_CHARS + '"}\n')
    outputs = {}
    for engine in ("local", "spark"):
        out = tmp_path / engine
        result = runner.invoke(app, ["run", "--engine", engine, "--input", str(events),
                                     "--output", str(out)])
        assert result.exit_code == 0, result.output
        outputs[engine] = (
            sorted(tuple(map(str, r.values())) for r in read_parquet_rows(out / "outcomes")),
            sorted(tuple(map(str, r.values())) for r in read_parquet_rows(out / "quarantine")))
    assert outputs["spark"] == outputs["local"]
    outcomes, quarantine = outputs["local"]
    assert len(outcomes) > 1000 and len(quarantine) > 30  # the inside link's rows came twice
    assert [row[0][:37] for row in quarantine if row[1] == "too_long"] == [
        '{"ts_ms": 1, "type": "tick", "pad": "']
    assert not any("root:x:0:0" in row[0] for row in quarantine)  # the outside one: never


def test_parquet_files_that_do_not_fit_the_contract_are_quarantined_not_fatal(
        tmp_path: Path) -> None:
    source = tmp_path / "in"
    source.mkdir()
    pq.write_table(pa.table({"ts_ms": pa.array([1.5, 2.5]), "type": pa.array(["tick"] * 2)}),
                   source / "a.parquet")
    (source / "b.parquet").write_bytes(b"PAR1 but cut short")
    pq.write_table(pa.table({"ts_ms": [3], "type": ["tick"], "pad": ["x" * MAX_ROW_CHARS]}),
                   source / "c.parquet")
    out = tmp_path / "out"
    result = runner.invoke(app, ["run", "--input", str(source), "--output", str(out)])
    assert result.exit_code == 0, result.output
    quarantine = read_parquet_rows(out / "quarantine")
    assert sorted(q["reason"] for q in quarantine) == [
        "bad_type", "bad_type", "too_long", "unparseable"]
    assert [q["raw"] for q in quarantine if q["reason"] == "too_long"] == [
        ('{"pad": "' + "x" * MAX_ROW_CHARS)[:TOO_LONG_KEPT_CHARS]]
    assert any(q["raw"].startswith("unreadable Parquet file b.parquet") for q in quarantine)
    assert {q["raw"] for q in quarantine if q["reason"] == "bad_type"} == {
        '{"ts_ms": 1.5, "type": "tick"}', '{"ts_ms": 2.5, "type": "tick"}'}


def test_a_parquet_file_is_read_a_batch_at_a_time_and_its_rows_kept_up_to_a_bad_page(
        tmp_path: Path) -> None:
    path = tmp_path / "a.parquet"
    pq.write_table(pa.table({"ts_ms": list(range(40)), "type": ["tick"] * 40}), path,
                   row_group_size=20)
    assert [len(rows) for rows in parquet_events(path, batch_rows=8)] == [8, 8, 4, 8, 8, 4]
    content = bytearray(path.read_bytes())
    page = pq.ParquetFile(path).metadata.row_group(1).column(0).data_page_offset
    content[page:page + 8] = b"\xff" * 8  # the second row group's first page header
    path.write_bytes(bytes(content))
    rows = [row for batch in parquet_events(path, batch_rows=8) for row in batch]
    assert [row.ts_ms for row in rows[:20]] == list(range(20))
    assert len(rows) == 21 and isinstance(rows[20], Quarantined)
    assert rows[20].reason is Reason.UNPARSEABLE
    assert rows[20].raw.startswith("unreadable Parquet file a.parquet after 20 rows: ")
    assert str(tmp_path) not in rows[20].raw  # the same raw text from either engine


def test_a_large_parquet_file_is_never_held_whole_as_rows(tmp_path: Path) -> None:
    path = tmp_path / "a.parquet"
    pq.write_table(pa.table({"ts_ms": list(range(50_000)), "type": ["tick"] * 50_000}), path,
                   row_group_size=5_000)
    tracemalloc.start()
    try:
        count = sum(len(rows) for rows in parquet_events(path, batch_rows=1_000))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert count == 50_000
    assert peak < 4 << 20  # the file's rows as Python objects take over 10 MiB


def test_parquet_maps_and_columns_that_repeat_a_name_are_quarantined_not_read_one_way(
        tmp_path: Path) -> None:
    source = tmp_path / "in"
    source.mkdir()
    targets = pa.map_(pa.string(), pa.int64())
    watch = {"ts_ms": [1], "type": ["watch"], "op_id": ["w"], "keys": [["k"]],
             "deadline_ms": [9], "condition": ["all_at_least"]}
    pq.write_table(pa.table({**watch, "targets": pa.array([[("k", 1)]], targets)}),
                   source / "a-good.parquet")
    pq.write_table(pa.table({**watch, "targets": pa.array([[("k", 1), ("k", 2)]], targets)}),
                   source / "b-map.parquet")
    pq.write_table(pa.table({**watch, "targets": pa.array([[1, 2]])}), source / "c-list.parquet")
    pq.write_table(pa.Table.from_arrays([pa.array([5]), pa.array(["cancel"]), pa.array(["w"]),
                                         pa.array(["x"])], ["ts_ms", "type", "op_id", "op_id"]),
                   source / "d-columns.parquet")
    pq.write_table(pa.table({**watch, "targets": pa.array(
        [[(["k"], 1)]], pa.map_(pa.list_(pa.string()), pa.int64()))}), source / "e-keys.parquet")
    (source / "f.jsonl").write_text('{"ts_ms":2,"type":"update","key":"k","value":1}\n')
    out = tmp_path / "out"
    result = runner.invoke(app, ["run", "--input", str(source), "--output", str(out)])
    assert result.exit_code == 0, result.output
    assert [(o["op_id"], o["outcome"]) for o in read_parquet_rows(out / "outcomes")] == [
        ("w", "completed")]  # the good file's watch; the others' rows never applied
    assert sorted((q["reason"], q["ts_ms"], q["raw"])
                  for q in read_parquet_rows(out / "quarantine")) == [
        ("bad_type", 1, '{"condition": "all_at_least", "deadline_ms": 9, "keys": ["k"], '
                        '"op_id": "w", "targets": [1, 2], "ts_ms": 1, "type": "watch"}'),
        ("bad_type", 1, '{"condition": "all_at_least", "deadline_ms": 9, "keys": ["k"], '
                        '"op_id": "w", "targets": [[["k"], 1]], "ts_ms": 1, "type": "watch"}'),
        ("duplicate_field", 1, '{"ts_ms":1,"type":"watch","op_id":"w","keys":["k"],'
                               '"deadline_ms":9,"condition":"all_at_least",'
                               '"targets":{"k":1,"k":2}}'),
        ("duplicate_field", 5, '{"ts_ms":5,"type":"cancel","op_id":"w","op_id":"x"}')]


def test_a_dedupe_retention_lets_a_reused_op_id_start_a_new_operation(tmp_path: Path) -> None:
    source = tmp_path / "in"
    source.mkdir()
    rows = [{"ts_ms": ts, "type": "watch", "op_id": "job", "keys": [],
             "deadline_ms": ts + 10, "condition": "none"} for ts in (0, 1_000)]
    rows.append({"ts_ms": 2_000, "type": "tick"})
    (source / "a.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    counts = []
    for extra in ([], ["--dedupe-retention-ms", "500"]):
        out = tmp_path / f"out{len(extra)}"
        result = runner.invoke(app, ["run", "--input", str(source), "--output", str(out),
                                     *extra])
        assert result.exit_code == 0, result.output
        counts.append((len(read_parquet_rows(out / "outcomes")),
                       len(read_parquet_rows(out / "quarantine"))))
    assert counts == [(1, 1), (2, 0)]
    bad = runner.invoke(app, ["run", "--input", str(source), "--output", str(tmp_path / "x"),
                              "--dedupe-retention-ms", "-1"])
    assert bad.exit_code == 2


@pytest.mark.parametrize("value", ["0", "-1", "five"])
def test_the_pipeline_benchmark_rejects_bad_files_per_trigger(
        value: str, capsys: pytest.CaptureFixture[str]) -> None:
    from benchmarks.__main__ import main as bench_main

    with pytest.raises(SystemExit) as exited:
        bench_main(["pipeline", "--files-per-trigger", value])
    assert exited.value.code == 2
    assert "--files-per-trigger" in capsys.readouterr().err


@pytest.mark.parametrize(("args", "named"), [
    (["timers", "--sizes", "0"], "--sizes"), (["timers", "--sizes", "1,x"], "--sizes"),
    (["timers", "--workloads", "W9"], "--workloads"), (["timers", "--repeat", "0"], "--repeat"),
    (["asyncio", "--n", "0"], "--n"), (["purgatory", "--operations", "5"], "--operations"),
    (["dispatcher", "--workers", "0"], "--workers"),
    (["dispatcher", "--batch", "500", "--buffer", "100"], "--batch (500)"),
    (["pipeline", "--events", "0"], "--events"), (["follow", "--lateness-ms", "-1"],
                                                   "--lateness-ms"),
])
def test_a_benchmark_refuses_bad_arguments_before_any_work(
        args: list[str], named: str, capsys: pytest.CaptureFixture[str]) -> None:
    from benchmarks.__main__ import main as bench_main

    with pytest.raises(SystemExit) as exited:
        bench_main(args)
    assert exited.value.code == 2
    assert named in capsys.readouterr().err


@pytest.mark.parametrize(("value", "expected", "header"), [
    ("all", None, "all the input per micro-batch"),
    ("4", 4, "4 files per micro-batch"),
    (None, None, "all the input per micro-batch"),  # the engine's default unless told
])
def test_the_pipeline_benchmark_passes_files_per_trigger_on(
        value: str | None, expected: int | None, header: str,
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from benchmarks import _pipeline
    from benchmarks.__main__ import main as bench_main

    seen = []

    def fake_run(events: int, repeat: int, partitions: int, per_trigger: int | None,
                 progress: object) -> list[_pipeline.PipelineResult]:
        seen.append(per_trigger)
        return [_pipeline.PipelineResult(name, 1000, [0.01])
                for name in ("reference", "spark local[1] cold", "spark local[1] warm",
                             "spark local[2] cold", "spark local[2] warm")]

    monkeypatch.setattr(_pipeline, "run_pipeline", fake_run)
    option = [] if value is None else ["--files-per-trigger", value]
    assert bench_main(["pipeline", *option]) == 0
    assert seen == [expected]
    assert header in capsys.readouterr().out


def test_the_pipeline_benchmark_reports_each_rounds_scaling(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from benchmarks import _pipeline
    from benchmarks.__main__ import main as bench_main

    seconds = {"reference": [1.0, 1.0, 1.0],
               "spark local[1] cold": [10.0, 12.0, 11.0],
               "spark local[1] warm": [9.0, 9.0, 9.0],
               "spark local[2] cold": [6.25, 6.0, 8.0],
               "spark local[2] warm": [5.0, 4.5, 6.0]}

    def fake_run(events: int, repeat: int, partitions: int, per_trigger: int | None,
                 progress: object) -> list[_pipeline.PipelineResult]:
        return [_pipeline.PipelineResult(name, 1000, times) for name, times in seconds.items()]

    monkeypatch.setattr(_pipeline, "run_pipeline", fake_run)
    assert bench_main(["pipeline", "--repeat", "3"]) == 0
    out = capsys.readouterr().out
    # Medians 11.0 / 6.25 s cold: the ratio of the medians, then each round's.
    assert "local[2] / local[1], cold: 1.76x (rounds 1.60x, 2.00x, 1.38x)" in out
    assert "local[2] / local[1], warm: 1.80x (rounds 1.80x, 2.00x, 1.50x)" in out


def test_the_pipeline_benchmark_takes_its_options(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from benchmarks import _pipeline
    from benchmarks.__main__ import main as bench_main

    seen = []

    def fake_run(events: int, repeat: int, partitions: int, per_trigger: int | None,
                 progress: object) -> list[_pipeline.PipelineResult]:
        seen.append((events, repeat, per_trigger))
        return [_pipeline.PipelineResult(name, events, [0.01])
                for name in ("reference", "spark local[1] cold", "spark local[1] warm",
                             "spark local[2] cold", "spark local[2] warm")]

    monkeypatch.setattr(_pipeline, "run_pipeline", fake_run)
    assert bench_main(["pipeline", "--events", "5000", "--repeat", "3",
                       "--files-per-trigger", "all"]) == 0
    assert seen == [(5000, 3, None)]
    with pytest.raises(SystemExit) as done:
        bench_main(["pipeline", "--files-per-trigger", "0"])
    assert done.value.code == 2
    assert seen == [(5000, 3, None)], "a bad option must stop the benchmark before it runs"


# -- output directories: a run never mixes in files it did not write ----------------------


def _generated(tmp_path: Path, events: int = 2000) -> Path:
    source = tmp_path / "events"
    result = runner.invoke(app, ["generate", "--events", str(events), "--rows-per-file", "700",
                                 "--output", str(source)])
    assert result.exit_code == 0, result.output
    return source


def _rows(directory: Path) -> list[tuple[str, ...]]:
    return sorted(tuple(map(str, r.values())) for r in read_parquet_rows(directory))


def test_the_local_engine_refuses_an_output_holding_anything(tmp_path: Path) -> None:
    source, out = _generated(tmp_path), tmp_path / "out"
    run = ["run", "--input", str(source), "--output", str(out)]
    assert runner.invoke(app, run).exit_code == 0
    first = _rows(out / "outcomes")
    again = runner.invoke(app, run)
    assert again.exit_code == 2 and "earlier run" in again.output
    (out / "notes.txt").write_text("mine")
    assert runner.invoke(app, run).exit_code == 2
    result = runner.invoke(app, [*run, "--overwrite"])
    assert result.exit_code == 0, result.output
    assert _rows(out / "outcomes") == first  # replaced, not doubled
    assert (out / "notes.txt").read_text() == "mine"  # left alone, never read


def test_a_stray_parquet_file_in_the_outputs_is_refused_by_run_and_report(
        tmp_path: Path) -> None:
    source, out = _generated(tmp_path), tmp_path / "out"
    assert runner.invoke(app, ["run", "--input", str(source), "--output", str(out)]).exit_code == 0
    pq.write_table(pa.table({"colour": ["blue"]}), out / "outcomes" / "mine.parquet")
    result = runner.invoke(app, ["report", "--output", str(out)])
    assert result.exit_code == 1 and "mine.parquet" in result.output
    stray = tmp_path / "fresh" / "quarantine"
    stray.mkdir(parents=True)
    pq.write_table(pa.table({"colour": ["blue"]}), stray / "part-00000.parquet")
    result = runner.invoke(app, ["report", "--output", str(tmp_path / "fresh")])
    assert result.exit_code == 2  # no outcomes/ at all
    (stray.parent / "outcomes").mkdir()
    result = runner.invoke(app, ["report", "--output", str(tmp_path / "fresh")])
    assert result.exit_code == 1 and "reason" in result.output  # the missing columns


@pytest.mark.parametrize(("column", "values", "why"), [
    ("latency_ms", pa.array(["5"], pa.string()), "holds string, not int64"),
    ("latency_ms", pa.array([None], pa.int64()), "holds 1 nulls"),
    ("outcome", pa.array([None], pa.string()), "holds 1 nulls"),
    ("op_id", pa.array([7], pa.int64()), "holds int64, not string"),
])
@pytest.mark.parametrize("as_json", [False, True])
def test_a_report_on_outputs_it_cannot_read_says_so_in_one_line(
        tmp_path: Path, column: str, values: pa.Array, why: str, as_json: bool) -> None:
    from tickwheel.pipeline.io.outputs import outcomes_table

    out = tmp_path / "out"
    (out / "outcomes").mkdir(parents=True)
    (out / "quarantine").mkdir()
    table = outcomes_table([])
    good = {name: pa.array([None], table.schema.field(name).type) for name in table.column_names}
    good |= {"op_id": pa.array(["a-1"]), "outcome": pa.array(["expired"]),
             "resolved_ms": pa.array([5], pa.int64()), "latency_ms": pa.array([5], pa.int64())}
    pq.write_table(pa.table(good | {column: values}), out / "outcomes" / "part-00000.parquet")
    result = runner.invoke(app, ["report", "--output", str(out), *(["--json"] * as_json)])
    assert result.exit_code == 1, result.output
    assert why in result.output and "part-00000.parquet" in result.output
    assert len(result.output.strip().splitlines()) == 1 and "Traceback" not in result.output
    assert "null" not in result.output.replace("nulls", "")


@pytest.mark.spark
def test_the_spark_engine_takes_only_its_own_checkpoints_outputs(spark: object,
                                                                 tmp_path: Path) -> None:
    source, out = _generated(tmp_path), tmp_path / "out"
    run = ["run", "--engine", "spark", "--input", str(source), "--output", str(out)]
    assert runner.invoke(app, run).exit_code == 0
    first = _rows(out / "outcomes")
    result = runner.invoke(app, run)  # the same checkpoint goes on: nothing doubles
    assert result.exit_code == 0, result.output
    assert _rows(out / "outcomes") == first
    other = runner.invoke(app, [*run, "--checkpoint", str(tmp_path / "other")])
    assert other.exit_code == 2 and "another checkpoint" in other.output
    assert not (tmp_path / "other").exists()
    pq.write_table(pa.table({"colour": ["blue"]}), out / "outcomes" / "mine.parquet")
    stray = runner.invoke(app, run)
    assert stray.exit_code == 2 and "mine.parquet" in stray.output
    result = runner.invoke(app, [*run, "--overwrite"])  # afresh, the checkpoint too
    assert result.exit_code == 0, result.output
    assert _rows(out / "outcomes") == first
    assert not (out / "outcomes" / "mine.parquet").exists()


def test_a_jvm_that_cannot_start_is_reported_with_what_it_printed(tmp_path: Path) -> None:
    pytest.importorskip("pyspark")
    source = _generated(tmp_path)
    env = {**os.environ, "JAVA_HOME": str(tmp_path / "no-java"), "SPARK_LOCAL_IP": "127.0.0.1"}
    result = subprocess.run([sys.executable, "-m", "tickwheel.cli", "run", "--engine", "spark",
                             "--input", str(source), "--output", str(tmp_path / "out")],
                            capture_output=True, text=True, env=env, timeout=300, check=False)
    assert result.returncode == 1, result.stdout + result.stderr
    printed = " ".join((result.stdout + result.stderr).split())
    assert "could not start Spark" in printed
    assert "no-java/bin/java" in printed  # the JVM's own words, from the log's last lines
    assert "Traceback" not in printed


def test_spark_settings_are_read_as_spark_submit_reads_them() -> None:
    from tickwheel.pipeline.contract.limits import check_spark_settings

    assert check_spark_settings(["spark.executor.memory=2g", "spark.a.b=x=y", "spark.c=",
                                 "spark.executor.memory=2g"]) == {
        "spark.executor.memory": "2g", "spark.a.b": "x=y", "spark.c": ""}
    with pytest.raises(ValueError, match="given twice, as '2g' and '3g'"):
        check_spark_settings(["spark.executor.memory=2g", "spark.executor.memory=3g"])


@pytest.mark.spark
@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads /proc")
def test_the_driver_memory_is_the_heap_of_the_jvm_the_session_starts(tmp_path: Path) -> None:
    pytest.importorskip("pyspark")
    script = (
        "import os, pathlib\n"
        "from tickwheel.pipeline.spark import spark_session\n"
        "spark = spark_session('local[1]', driver_memory='600m', settings={\n"
        "    'spark.app.name': 'named-by-the-user',\n"
        "    'spark.driver.extraJavaOptions': '-Dtickwheel.probe=1'})\n"
        "print(spark.sparkContext.appName)\n"
        "kids = [int(k) for t in pathlib.Path(f'/proc/{os.getpid()}/task').iterdir()\n"
        "        for k in (t / 'children').read_text().split()]\n"
        "print([pathlib.Path(f'/proc/{k}/cmdline').read_bytes().split(b'\\0')\n"
        "       for k in kids])\n"
        "spark.stop()\n")
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"}
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            env=env, timeout=300, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "b'-Xmx600m'" in result.stdout, result.stdout
    # The user's settings reach the JVM the session starts, and the session.
    assert "b'-Dtickwheel.probe=1'" in result.stdout, result.stdout
    assert result.stdout.startswith("named-by-the-user\n"), result.stdout
    with pytest.raises(ValueError, match="driver memory must be"):
        from tickwheel.pipeline.spark import spark_session

        spark_session("local[1]", driver_memory="600")
    with pytest.raises(ValueError, match=r"spark\.master cannot be set here"):
        spark_session("local[1]", settings={"spark.master": "local[4]"})


@pytest.mark.spark
@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads /proc")
def test_a_spark_run_ends_its_jvm_and_the_thread_that_logs_it_before_the_interpreter_exits(
        tmp_path: Path) -> None:
    """A thread still logging the JVM's output while the interpreter exits can hold the
    terminal stream's lock as the interpreter flushes it, and CPython aborts (SIGABRT)
    after the run's work is done. At exit, neither the JVM nor that thread is left."""
    pytest.importorskip("pyspark")
    source = _generated(tmp_path)
    script = (
        "import atexit, os, pathlib, sys, threading\n"
        "def report():\n"
        "    kids = [k for t in pathlib.Path(f'/proc/{os.getpid()}/task').iterdir()\n"
        "            for k in (t / 'children').read_text().split()]\n"
        "    names = sorted(t.name for t in threading.enumerate()\n"
        "                   if t is not threading.main_thread())\n"
        "    print('AT EXIT', names, 'children', kids, file=sys.__stderr__, flush=True)\n"
        "atexit.register(report)  # registered first: runs after every other hook\n"
        "from tickwheel.cli import main\n"
        "sys.argv = ['tickwheel', *sys.argv[1:]]\n"
        "main()\n")
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"}
    result = subprocess.run(
        [sys.executable, "-c", script, "run", "--engine", "spark", "--input", str(source),
         "--output", str(tmp_path / "out")],
        capture_output=True, text=True, env=env, timeout=600, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    (line,) = [x for x in result.stderr.splitlines() if x.startswith("AT EXIT")]
    assert "tickwheel-spark-jvm-output" not in line, line
    assert line.endswith("children []"), line  # the JVM has exited, and was waited for


# -- input paths: both engines read the same files, or refuse the same ones ----------------


@pytest.mark.spark
def test_both_engines_read_the_same_rows_whatever_glob_characters_the_names_hold(
        spark: object, tmp_path: Path) -> None:
    # Hadoop takes {}[]*?\ as a pattern: Spark's own listing read nothing from such
    # a directory, and other files several times over beside such a file.
    generated = _generated(tmp_path)
    source = tmp_path / "in[1]{a,b}?*\\x"
    source.mkdir()
    names = iter(["extra[1].jsonl", "b\\c.jsonl", "q?.jsonl", "{x,y}.jsonl", "st*r.jsonl"])
    for path in sorted(generated.iterdir()):
        path.rename(source / next(names))
    pq.write_table(pa.table({"ts_ms": [1], "type": ["tick"]}), source / "[p]*.parquet")
    results = {}
    for engine in ("local", "spark"):
        out = tmp_path / engine
        result = runner.invoke(app, ["run", "--engine", engine, "--input", str(source),
                                     "--output", str(out)])
        assert result.exit_code == 0, result.output
        results[engine] = (_rows(out / "outcomes"), _rows(out / "quarantine"))
    outcomes, _ = results["local"]
    assert len(outcomes) > 100 and results["spark"] == results["local"]


@pytest.mark.parametrize("where", ["input", "output", "checkpoint"])
def test_the_spark_engine_refuses_a_path_with_a_byte_that_is_not_utf8(
        tmp_path: Path, where: str) -> None:
    odd = tmp_path / os.fsdecode(b"s\xffu")
    paths = {"input": tmp_path / "in", "output": tmp_path / "out",
             "checkpoint": tmp_path / "ckpt"}
    paths[where] = odd / where
    paths["input"].mkdir(parents=True)
    result = runner.invoke(app, ["run", "--engine", "spark", *(
        arg for name, path in paths.items() for arg in (f"--{name}", str(path)))])
    assert result.exit_code == 2, result.output
    text = " ".join(result.output.replace("│", " ").split())
    assert f"cannot use the {where} path" in text and "s\\xffu" in text, result.output
    assert not paths["output"].exists() and not paths["checkpoint"].exists()


def test_the_spark_engine_refuses_a_glob_character_in_its_checkpoint(tmp_path: Path) -> None:
    source = tmp_path / "in"
    source.mkdir()
    (source / "a.jsonl").write_text('{"ts_ms": 1, "type": "tick"}\n')
    result = runner.invoke(app, ["run", "--engine", "spark", "--input", str(source),
                                 "--output", str(tmp_path / "out"),
                                 "--checkpoint", str(tmp_path / "ck[1]")])
    assert result.exit_code == 2 and "--checkpoint" in result.output, result.output
    assert not (tmp_path / "out").exists()  # refused before Spark starts
    assert not (tmp_path / "ck[1]").exists()


@pytest.mark.parametrize("engine", ["local", "spark"])
def test_a_file_name_that_is_not_utf8_is_refused_by_both_engines(tmp_path: Path,
                                                                  engine: str) -> None:
    source = tmp_path / "in"
    source.mkdir()
    (source / os.fsdecode(b"bad-\xff.jsonl")).write_text('{"ts_ms": 1, "type": "tick"}\n')
    result = runner.invoke(app, ["run", "--engine", engine, "--input", str(source),
                                 "--output", str(tmp_path / "out")])
    assert result.exit_code == 2 and "UTF-8" in result.output, result.output


def test_a_symlink_out_of_the_input_directory_is_skipped_with_one_warning(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    source, out = _generated(tmp_path, events=500), tmp_path / "out"
    secret = tmp_path / "secret.jsonl"
    secret.write_text("root:x:0:0\n")
    (source / "zz-link.jsonl").symlink_to(secret)
    (source / "zz-inside.jsonl").symlink_to(source / "events-00001.jsonl")
    with caplog.at_level("WARNING", logger="tickwheel.pipeline.io.input_dir"):
        result = runner.invoke(app, ["run", "--input", str(source), "--output", str(out)])
    assert result.exit_code == 0, result.output
    warnings = [r.getMessage() for r in caplog.records if "skipping" in r.getMessage()]
    assert warnings == [f"skipping input file {str(source / 'zz-link.jsonl')!r}: a symlink "
                        f"to {str(secret.resolve())!r}, outside the input directory"]
    raws = [q["raw"] for q in read_parquet_rows(out / "quarantine")]
    assert "root:x:0:0" not in raws
    assert len(raws) > 0  # the link inside is followed: its rows are duplicates


def test_a_symlink_that_leads_nowhere_is_skipped(tmp_path: Path) -> None:
    source, out = _generated(tmp_path, events=500), tmp_path / "out"
    (source / "zz-loop.jsonl").symlink_to(source / "zz-loop.jsonl")
    (source / "zz-gone.jsonl").symlink_to(tmp_path / "gone.jsonl")
    result = runner.invoke(app, ["run", "--input", str(source), "--output", str(out)])
    assert result.exit_code == 0, result.output
    for link in ("zz-loop.jsonl", "zz-gone.jsonl"):
        (source / link).unlink()
    result = runner.invoke(app, ["run", "--input", str(source), "--output",
                                 str(tmp_path / "without")])
    assert result.exit_code == 0, result.output
    assert read_parquet_rows(out / "outcomes") == read_parquet_rows(tmp_path / "without" /
                                                                    "outcomes")


def test_a_directory_or_a_pipe_named_as_an_input_file_is_skipped_with_a_warning(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # Spark writes "events.jsonl" as a directory of parts; a pipe would block a read.
    source, out = _generated(tmp_path, events=500), tmp_path / "out"
    (source / "zz-parts.jsonl").mkdir()
    (source / "zz-parts.jsonl" / "part-0.jsonl").write_text("{}\n")
    os.mkfifo(source / "zz-pipe.jsonl")
    with caplog.at_level("WARNING", logger="tickwheel.pipeline.io.input_dir"):
        result = runner.invoke(app, ["run", "--input", str(source), "--output", str(out)])
    assert result.exit_code == 0, result.output
    warnings = sorted(r.getMessage() for r in caplog.records if "skipping" in r.getMessage())
    assert warnings == [
        f"skipping input file {str(source / 'zz-parts.jsonl')!r}: a directory, not a file: "
        "files in it are not read",
        f"skipping input file {str(source / 'zz-pipe.jsonl')!r}: not a regular file (a "
        "pipe, socket or device)"]


def test_a_file_that_is_not_a_log_is_left_unread_with_a_warning(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # A log kept compressed or under another suffix would otherwise vanish silently.
    source, out = _generated(tmp_path, events=500), tmp_path / "out"
    first = source / "events-00001.jsonl"
    (source / "more.jsonl.bz2").write_bytes(bz2.compress(first.read_bytes()))
    (source / "notes.csv").write_text("op_id,deadline\n")
    (source / ".incoming.jsonl.tmp").write_text("{}\n")  # being written: not mentioned
    (source / "_SUCCESS").write_text("")
    with caplog.at_level("WARNING", logger="tickwheel.pipeline.io.input_dir"):
        result = runner.invoke(app, ["run", "--input", str(source), "--output", str(out)])
    assert result.exit_code == 0, result.output
    warnings = sorted(r.getMessage() for r in caplog.records if "skipping" in r.getMessage())
    assert warnings == [
        f"skipping input file {str(source / 'more.jsonl.bz2')!r}: compressed with .bz2, "
        f"which is not read: the engines read {INPUT_NAMES}",
        f"skipping input file {str(source / 'notes.csv')!r}: not a log: the engines read "
        f"{INPUT_NAMES}"]
    assert "rows applied" in result.output and "500" in result.output
    assert "no input files" not in result.output


def test_an_input_directory_without_a_log_runs_empty_and_says_so(tmp_path: Path) -> None:
    source = tmp_path / "logs"
    source.mkdir()
    (source / "app.log").write_text("started\n")
    result = runner.invoke(app, ["run", "--input", str(source), "--output",
                                 str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    assert f"no input files in {source}: the engines read {INPUT_NAMES}" in " ".join(
        result.output.split())
    assert read_parquet_rows(tmp_path / "out" / "outcomes") == []


def test_the_scaling_benchmark_reports_each_partition_count(
        capsys: pytest.CaptureFixture[str]) -> None:
    from benchmarks.__main__ import main as bench_main

    assert bench_main(["pipeline", "--partitions", "1,4", "--scaling-events", "3000",
                       "--repeat", "1", "--spark-counts", "none"]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("| two stages |")]
    assert [row.split("|")[2].strip() for row in rows] == ["1", "4"]
    assert "| 1.00x |" in rows[0]
    assert bench_main(["pipeline", "--partitions", "1", "--spark-counts", "2,4,8"]) == 2
    assert "--spark-counts" in capsys.readouterr().err


def test_a_processor_named_on_the_command_line_gets_every_outcome(tmp_path: Path) -> None:
    from tests.pipeline import processors

    processors.COLLECTED.clear()
    source, out = _generated(tmp_path), tmp_path / "out"
    result = runner.invoke(app, ["run", "--input", str(source), "--output", str(out),
                                 "--processor", "tests.pipeline.processors:Collect"])
    assert result.exit_code == 0, result.output
    written = read_parquet_rows(out / "outcomes")
    assert written and len(processors.COLLECTED) == len(written)
    assert ({(o.op_id, o.outcome.value) for o in processors.COLLECTED}
            == {(r["op_id"], r["outcome"]) for r in written})
    assert f"delivered {len(written):,} outcomes" in result.output


def test_the_scaling_benchmark_runs_every_count_in_each_round(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from benchmarks import _scaling

    order: list[int] = []
    cpu = iter([1.0, 4.0, 3.0, 2.0, 5.0, 6.0])

    def fake(lines: list[str], partitions: int) -> tuple[float, float, int, int, int]:
        order.append(partitions)
        total = next(cpu)
        return total, total / 2, 10 * len(lines), 100 * len(lines), 20 * partitions**2

    monkeypatch.setattr(_scaling, "DESIGNS", {"fake": fake})
    rows = _scaling.run_scaling(500, [1, 4], 3, lambda _: None)
    # Rounds interleave the counts, so a slow spell of the machine hits both alike.
    assert order == [1, 4, 1, 4, 1, 4]
    assert [(r.partitions, r.total_cpu_s, r.slowest_cpu_s) for r in rows] == [
        (1, 3.0, 1.5), (4, 4.0, 2.0)]
    assert rows[0].rows_per_event == 10 and rows[0].bytes_per_event == 100
    assert [r.runs_bytes for r in rows] == [20, 320]  # a batch's, not per event
    assert "| 320 |" in _scaling.scaling_table(rows)


def _run_local(events: Path, out: Path, spill_events: int | None,
               monkeypatch: pytest.MonkeyPatch) -> tuple[list[pa.Table], int]:
    """A local run whose engine spills every ``spill_events`` events: its outcomes and
    quarantine tables, and the runs it spilled."""
    from tickwheel.cli import run as cli_run

    made: list[ReferenceEngine] = []

    class Engine(ReferenceEngine):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs | {"spill_events": spill_events})
            made.append(self)

    monkeypatch.setattr(cli_run, "ReferenceEngine", Engine)
    result = runner.invoke(app, ["run", "--input", str(events), "--output", str(out)])
    assert result.exit_code == 0, result.output
    # The runs on disk were files without a name.
    assert sorted(p.name for p in out.iterdir()) == ["_tickwheel.lock", "outcomes", "quarantine"]
    return ([pq.read_table(out / sub / "part-00000.parquet") for sub in ("outcomes", "quarantine")],
            made[0].spilled_runs)


def test_a_local_run_sorted_on_disk_writes_what_one_held_in_memory_writes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    events = tmp_path / "events"
    assert runner.invoke(app, ["generate", "--events", "6000", "--output", str(events),
                               "--malformed", "0.02", "--disorder-ms", "50"]).exit_code == 0
    in_memory, none = _run_local(events, tmp_path / "a", None, monkeypatch)
    on_disk, runs = _run_local(events, tmp_path / "b", 500, monkeypatch)
    assert (none, runs) == (0, 12)
    assert in_memory[0].num_rows > 2_000 and in_memory[1].num_rows >= 120
    assert in_memory[0].equals(on_disk[0]) and in_memory[1].equals(on_disk[1])


def test_a_disk_that_fills_up_stops_the_local_run_with_no_outputs_and_a_message(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import errno
    import tempfile

    from tickwheel.cli import run as cli_run

    class Engine(ReferenceEngine):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs | {"spill_events": 500})

    def no_space(*args: Any, **kwargs: Any) -> Any:
        raise OSError(errno.ENOSPC, "No space left on device")

    events, out = tmp_path / "events", tmp_path / "out"
    assert runner.invoke(app, ["generate", "--events", "2000", "--output", str(events),
                               "--malformed", "0.05"]).exit_code == 0
    monkeypatch.setattr(cli_run, "ReferenceEngine", Engine)
    monkeypatch.setattr(tempfile, "TemporaryFile", no_space)
    result = runner.invoke(app, ["run", "--input", str(events), "--output", str(out)])
    assert result.exit_code == 1
    assert "wrote no outputs" in result.output and "No space left on device" in result.output
    assert [p.name for p in out.rglob("*") if p.is_file()] == ["_tickwheel.lock"]



def test_a_batch_run_whose_processor_raises_exits_1_saying_how_many(tmp_path: Path) -> None:
    source, out = _generated(tmp_path), tmp_path / "out"
    result = runner.invoke(app, ["run", "--input", str(source), "--output", str(out),
                                 "--processor", "tests.pipeline.processors:Raises"])
    assert result.exit_code == 1, result.output
    assert "outcomes are not delivered" in result.output
    assert "to a processor that raised" in result.output and "failed" in result.output


def test_paths_are_printed_verbatim_not_as_emoji_or_markup(tmp_path: Path) -> None:
    odd = tmp_path / "logs:fire:2026 [bold]x[/bold]"
    result = runner.invoke(app, ["run", "--input", str(odd), "--output", str(tmp_path / "o")])
    assert result.exit_code == 2
    assert str(odd) in result.output and "\N{FIRE}" not in result.output
