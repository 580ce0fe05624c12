"""The Spark engine on a cluster of several processes: ``local-cluster[2,1,1024]``, two
executor JVMs with Python workers of their own, as the pip package runs it. Every
process talks over loopback (``SPARK_LOCAL_IP=127.0.0.1`` in the child's environment).
A cluster takes about a minute to start, so one run covers several things: the
executors run the sources shipped to them, and a cluster that loses an executor in the
middle of the run gives the reference engine's outcomes, as an undisturbed run does.
"""

from __future__ import annotations

import ast
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import wait_for
from tests.pipeline.logs import LATENESS_MS, random_log
from tests.pipeline.spark_helpers import (
    committed_batches,
    expected_outcomes,
    expected_quarantine,
    outcomes_of,
    quarantine_of,
    reference,
    write_files,
)

pytestmark = [pytest.mark.spark, pytest.mark.slow]

MASTER = "local-cluster[2,1,1024]"

RUN = f"""
import sys
from pathlib import Path
from tickwheel.pipeline.spark import SparkEngine, spark_session
base = Path(sys.argv[1])
spark = spark_session(sys.argv[2], driver_memory="1g",
                      settings={{"spark.submit.pyFiles": sys.argv[3]}})
try:
    where = spark.sparkContext.parallelize(range(4), 4).map(
        lambda _: (__import__("tickwheel").__file__, __import__("tickwheel").compiled))
    print(sorted(set(where.collect())), flush=True)
    SparkEngine(spark, base / "in", base / "out", base / "ckpt",
                lateness_ms={LATENESS_MS}, partitions=2, max_files_per_trigger=1).run()
finally:
    spark.stop()
"""


def _start(base: Path, tmp_path: Path, shipped: Path) -> subprocess.Popen[str]:
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable,
               SPARK_LOCAL_DIRS=str(tmp_path / "spark-local"))
    return subprocess.Popen([sys.executable, "-c", RUN, str(base), MASTER, str(shipped)],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)


def _executors(session: int) -> list[int]:
    """The executor JVMs of the process group ``session`` (the run and its children)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            pid = int(entry.name)
            if b"CoarseGrainedExecutorBackend" in cmdline and os.getpgid(pid) == session:
                found.append(pid)
        except OSError:
            continue
    return found


def test_executors_run_the_shipped_sources_and_losing_one_changes_no_outcome(
        tmp_path: Path) -> None:
    # The executors' Python has tickwheel installed too: the zip shipped with
    # spark.submit.pyFiles comes first on their module path, so they run what was shipped.
    shipped = tmp_path / "tickwheel.zip"
    subprocess.run([sys.executable, "-m", "tickwheel.pipeline.spark.job", "--zip", str(shipped)],
                   check=True, capture_output=True)
    base = tmp_path / "run"
    write_files(random_log(7, rows=4_000), base / "in", files=5)
    proc = _start(base, tmp_path, shipped)
    # Micro-batches committed (status files only keep the latest of them).
    wait_for(lambda: committed_batches(base / "ckpt") >= 2, "two micro-batches", proc, 300)
    executors = _executors(proc.pid)
    assert len(executors) == 2, executors
    os.kill(executors[0], signal.SIGKILL)
    assert committed_batches(base / "ckpt") < 6, "the kill came too late"
    out, err = proc.communicate(timeout=600)
    imported = ast.literal_eval(out.strip().splitlines()[0])
    assert imported and all(where.endswith("tickwheel.zip/tickwheel/__init__.py")
                            and compiled is False for where, compiled in imported), imported
    if proc.returncode != 0:
        # The query may fail instead of rerunning the lost tasks: a restart on its
        # checkpoint goes on, and must end the same.
        again = _start(base, tmp_path, shipped)
        _, err = again.communicate(timeout=600)
        assert again.returncode == 0, err[-3000:]
    expected = reference(base / "in")
    got = outcomes_of(base / "out")
    assert len(set(got)) == len(got), "an outcome was written twice"
    assert got == expected_outcomes(expected)
    assert quarantine_of(base / "out") == expected_quarantine(expected)
