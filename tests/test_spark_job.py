"""The Spark engine runs as a spark-submit application (tickwheel.pipeline.spark.job)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.conftest import wait_for
from tests.pipeline.logs import LATENESS_MS, random_log
from tests.pipeline.spark_helpers import (
    outcomes_of,
    quarantine_of,
    spark_rows_in,
    write_files,
)
from tickwheel.pipeline.spark import job as spark_job


def test_path_names_the_file_spark_submit_runs(capsys: pytest.CaptureFixture[str]) -> None:
    assert spark_job.main(["--path"]) == 0
    path = Path(capsys.readouterr().out.strip())
    assert path.is_file() and path.name == "job.py"
    assert path == Path(spark_job.__file__).resolve()


def test_zip_writes_the_sources_that_executors_import_as_the_pure_python_build(
        tmp_path: Path) -> None:
    target = tmp_path / "tick wheel.zip"
    done = subprocess.run([sys.executable, "-m", "tickwheel.pipeline.spark.job", "--zip",
                           str(target)], capture_output=True, check=True)
    assert Path(os.fsdecode(done.stdout.rstrip(b"\n"))) == target.resolve()
    root = Path(spark_job.__file__).resolve().parents[2]  # the tickwheel package
    sources = {(Path("tickwheel") / p.relative_to(root)).as_posix()
               for p in root.rglob("*.py") if "__pycache__" not in p.parts}
    assert set(zipfile.ZipFile(target).namelist()) == sources
    assert [p.name for p in tmp_path.iterdir()] == [target.name]  # no temporary left
    # Readable as a file the user writes is: Spark's file server or another node reads it.
    assert target.stat().st_mode & 0o444 == 0o444 & ~_umask()
    # First on the path, as --py-files puts it on an executor's.
    probe = ("import sys; sys.path.insert(0, sys.argv[1]); import tickwheel; "
             "from tickwheel.pipeline.contract.events import compact_wire; "
             "print(tickwheel.__file__, tickwheel.compiled, "
             "compact_wire('{\"ts_ms\":5,\"type\":\"tick\"}'), sep='\\n')")
    ran = subprocess.run([sys.executable, "-c", probe, str(target)], capture_output=True,
                         text=True, check=True, cwd=tmp_path)
    where, compiled, row = ran.stdout.splitlines()
    assert where == str(target / "tickwheel" / "__init__.py")
    assert compiled == "False" and row.strip().startswith("(5, 'tick'")


def _umask() -> int:
    # Read from /proc: os.umask would set it, for the whole process, to read it.
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("Umask:"):
            return int(line.split()[1], 8)
    raise AssertionError("no Umask line in /proc/self/status")


@pytest.mark.parametrize("name, message", [
    ("missing/out.zip", "is not a directory"),
    (".", "is a directory"),
])
def test_zip_refuses_a_path_it_cannot_write(name: str, message: str, tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit:
        spark_job.main(["--zip", str(tmp_path / name)])
    assert exit.value.code == 2
    assert message in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_zip_refuses_to_replace_what_is_not_a_regular_file(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pipe = tmp_path / "pipe.zip"
    os.mkfifo(pipe)
    with pytest.raises(SystemExit) as exit:
        spark_job.main(["--zip", str(pipe)])
    assert exit.value.code == 2
    assert "is not a regular file" in capsys.readouterr().err
    assert pipe.is_fifo() and [p.name for p in tmp_path.iterdir()] == ["pipe.zip"]


def test_run_as_a_file_it_takes_its_own_directory_off_the_module_path(tmp_path: Path) -> None:
    # tickwheel's directory holds client.py, metrics.py, ...: first on the path, they would
    # stand in for other modules of those names.
    probe = tmp_path / "probe.py"
    probe.write_text(
        "import runpy, sys\n"
        f"sys.argv = [{spark_job.__file__!r}, '--path']\n"
        f"sys.path.insert(0, {str(Path(spark_job.__file__).parent)!r})\n"
        "try:\n"
        f"    runpy.run_path({spark_job.__file__!r}, run_name='__main__')\n"
        "except SystemExit as exit:\n"
        "    assert exit.code == 0\n"
        f"print({str(Path(spark_job.__file__).parent)!r} in sys.path)\n")
    done = subprocess.run([sys.executable, str(probe)], capture_output=True, text=True,
                          check=True)
    printed_path, in_path = done.stdout.split()
    assert Path(printed_path) == Path(spark_job.__file__).resolve()
    assert in_path == "False"


def test_outside_spark_submit_it_refuses_and_says_what_to_run_instead(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("PYSPARK_GATEWAY_PORT", raising=False)
    with pytest.raises(SystemExit) as exit:
        spark_job.main(["--input", str(tmp_path), "--output", str(tmp_path / "out")])
    assert exit.value.code == 2
    err = capsys.readouterr().err
    assert "spark-submit" in err and "tickwheel run --engine spark" in err
    with pytest.raises(SystemExit) as exit:
        spark_job.main(["--output", str(tmp_path / "out")])
    assert exit.value.code == 2
    assert "--input and --output are required" in capsys.readouterr().err


@pytest.mark.parametrize(("args", "message"), [
    (["--lateness-ms", "-1"], "argument --lateness-ms: must be at least 0, got -1"),
    (["--partitions", "0"], "argument --partitions: must be at least 1, got 0"),
    (["--max-files-per-trigger", "x"], "argument --max-files-per-trigger: 'x' is not an integer"),
    (["--dedupe-retention-ms", "-5"], "argument --dedupe-retention-ms: must be at least 0"),
    (["--input", "/nonexistent/events"],
     "--input: input directory /nonexistent/events does not exist"),
    (["--clock", "wall"], "--trigger-ms and --clock apply to --follow only"),
    (["--follow", "--trigger-ms", "0"], "argument --trigger-ms: must be at least 1, got 0"),
    (["--follow", "--clock", "sundial"], "argument --clock: invalid choice: 'sundial'"),
    (["--follow", "--no-final"], "--no-final does not apply to --follow"),
])
def test_bad_arguments_are_refused_before_spark_starts(
        args: list[str], message: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    # As under spark-submit: only the arguments stand between the job and its session.
    monkeypatch.setenv("PYSPARK_GATEWAY_PORT", "1")
    base = ["--input", str(tmp_path), "--output", str(tmp_path / "out")]
    with pytest.raises(SystemExit) as exit:
        spark_job.main(base + args)
    assert exit.value.code == 2
    assert message in capsys.readouterr().err


def _python_driver(session: int) -> int | None:
    """The Python process that spark-submit started for the job, in its session."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            if (os.getsid(int(entry.name)) == session and "python" in Path(argv[0].decode()).name
                    and any(arg.endswith(b"/spark/job.py") for arg in argv)):
                return int(entry.name)
    return None


@pytest.mark.spark
def test_spark_submit_runs_it_on_its_master_until_sigterm_between_micro_batches(
        tmp_path: Path) -> None:
    """The job as spark-submit starts it: on spark-submit's master (local[1], one
    partition, not the embedded default), following its input until SIGTERM, with the
    local engine's outcomes. The batch path is the engine's own (test_spark_engine)."""
    import pyspark

    from tickwheel.pipeline.engines.follow import LocalFollowEngine

    lines = random_log(12, rows=900)
    inbox, out = tmp_path / "in", tmp_path / "out"
    write_files(lines[:600], inbox, files=2)
    spark_submit = Path(pyspark.__file__).parent / "bin" / "spark-submit"
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, SPARK_LOCAL_IP="127.0.0.1")
    child = subprocess.Popen(
        [str(spark_submit), "--master", "local[1]", "--conf", "spark.ui.enabled=false",
         spark_job.__file__, "--follow", "--trigger-ms", "300", "--input", str(inbox),
         "--output", str(out), "--lateness-ms", str(LATENESS_MS)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True)

    try:
        wait_for(lambda: spark_rows_in(out) >= 600, "the first files", child, 240)
        write_files(lines[600:], inbox, files=1, start=2)  # a file lands while it runs
        wait_for(lambda: spark_rows_in(out) >= len(lines), "the file that landed", child, 240)
        driver = _python_driver(child.pid)
        assert driver is not None
        os.kill(driver, signal.SIGTERM)
        output, errors = child.communicate(timeout=180)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signal.SIGKILL)
    assert child.returncode == 0, errors[-3000:]
    assert "SIGTERM: stopping after this micro-batch" in output, output
    assert "1 partition per stage" in output, output
    assert f"{len(lines):,} rows in" in output, output
    local = LocalFollowEngine(inbox, tmp_path / "local", lateness_ms=LATENESS_MS)
    local.step()
    assert outcomes_of(out) == outcomes_of(tmp_path / "local")
    assert quarantine_of(out) == quarantine_of(tmp_path / "local")
