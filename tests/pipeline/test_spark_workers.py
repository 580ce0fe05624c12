"""How the session starts its JVM and Python workers (local mode, the embedded default)."""

from __future__ import annotations

import gc
import inspect
import json
import os
import subprocess
import sys
import types
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tickwheel.pipeline._spark_daemon import use_young_collections
from tickwheel.pipeline._spark_python import launcher, without_bundled_zips
from tickwheel.pipeline._spark_session import (
    LOCAL_JAVA_OPTIONS,
    environment_variable,
    huge_pages_on_request,
    with_huge_page_malloc,
)

# Read when pytest collects this module, before any test starts a session.
_TUNABLES_BEFORE_ANY_SESSION = os.environ.get("GLIBC_TUNABLES")


def _package_with_zips(site: Path) -> tuple[str, str]:
    package = site / "pyspark"
    (package / "python" / "lib").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    zips = []
    for name in ("pyspark.zip", "py4j-0.10.9.9-src.zip"):
        path = package / "python" / "lib" / name
        with zipfile.ZipFile(path, "w"):
            pass
        zips.append(str(path))
    return zips[0], zips[1]


def test_the_zips_shipped_inside_the_installed_pyspark_leave_the_path(tmp_path: Path) -> None:
    site = tmp_path / "site-packages"
    pyspark_zip, py4j_zip = _package_with_zips(site)
    path = [pyspark_zip, py4j_zip, "/somewhere/else", str(site)]
    assert without_bundled_zips(path) == ["/somewhere/else", str(site)]


def test_zips_of_another_spark_stay_first(tmp_path: Path) -> None:
    site = tmp_path / "site-packages"
    _package_with_zips(site)
    distribution = tmp_path / "spark-home" / "python" / "lib"
    distribution.mkdir(parents=True)
    own_zip = distribution / "pyspark.zip"
    with zipfile.ZipFile(own_zip, "w"):
        pass
    path = [str(own_zip), str(site)]
    assert without_bundled_zips(path) == path


def test_without_an_installed_pyspark_the_path_is_unchanged(tmp_path: Path) -> None:
    lonely = tmp_path / "pyspark.zip"
    with zipfile.ZipFile(lonely, "w"):
        pass
    path = [str(lonely), str(tmp_path / "empty")]
    assert without_bundled_zips(path) == path
    assert without_bundled_zips(["/a", "/b"]) == ["/a", "/b"]


_SHOW = """
import json, sys
import pyspark
print(json.dumps({"argv": sys.argv, "pyspark": pyspark.__file__, "path0": sys.path[0],
                  "zips": [p for p in sys.path if "pyspark" in p and p.endswith(".zip")]}))
"""


def _installed_launcher() -> str:
    found = launcher()
    if found is None:
        pytest.skip("tickwheel is not installed next to this interpreter")
    return found


def test_the_launcher_runs_a_module_as_python_m_does_with_the_installed_pyspark(
        tmp_path: Path) -> None:
    import pyspark

    lib = Path(pyspark.__file__).parent / "python" / "lib"
    zips = sorted(str(z) for z in lib.glob("*.zip"))
    if not zips:
        pytest.skip("this PySpark ships no zips")
    (tmp_path / "show.py").write_text(_SHOW)
    done = subprocess.run([_installed_launcher(), "-m", "show", "a", "-m"], cwd=tmp_path,
                          env=dict(os.environ, PYTHONPATH=os.pathsep.join(zips)),
                          capture_output=True, text=True, check=True)
    facts = json.loads(done.stdout)
    assert facts["argv"] == [str(tmp_path / "show.py"), "a", "-m"]
    assert facts["path0"] == str(tmp_path)
    assert facts["zips"] == []
    assert facts["pyspark"] == pyspark.__file__


def test_the_launcher_hands_anything_else_to_the_interpreter() -> None:
    done = subprocess.run([_installed_launcher(), "-c", "import sys; print(sys.executable)"],
                          capture_output=True, text=True, check=True)
    assert done.stdout.strip() == sys.executable
    failed = subprocess.run([_installed_launcher(), "-c", "raise SystemExit(3)"], check=False)
    assert failed.returncode == 3


def _worker_facts(_rows: Iterator[Any]) -> Iterator[tuple[str, int, str | None, list[str],
                                                          list[str], str, bool]]:
    import gc
    import sys

    import pyspark

    main = sys.modules["__main__"].__spec__
    after_task_gc = type(sys.modules["pyspark.daemon"].gc).__name__
    # Nothing this task runs imports them.
    preloaded = "pandas" in sys.modules and "pyarrow" in sys.modules
    yield (pyspark.__file__ or "", gc.get_freeze_count(), None if main is None else main.name,
           [entry for entry in sys.path if entry.endswith(".zip") and "pyspark" in entry],
           sys.orig_argv, after_task_gc, preloaded)


_PRELOAD = """
import json, os, sys
from tickwheel.pipeline._spark_daemon import PRELOADED, preload
done = preload()
print(json.dumps([done, len(os.listdir("/proc/self/task")),
                  [name for name in PRELOADED if name in sys.modules]]))
"""


def _preload_in_a_fresh_interpreter(**environment: str) -> list[Any]:
    env = {name: value for name, value in os.environ.items()
           if name not in ("JE_ARROW_MALLOC_CONF", "OPENBLAS_NUM_THREADS")}
    out = subprocess.run([sys.executable, "-c", _PRELOAD], env={**env, **environment},
                         check=True, capture_output=True, text=True).stdout
    result: list[Any] = json.loads(out)
    return result


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="counts threads in /proc")
def test_the_daemon_imports_pandas_and_pyarrow_for_its_workers_without_starting_a_thread(
        ) -> None:
    from tickwheel.pipeline._spark_daemon import PRELOADED

    assert _preload_in_a_fresh_interpreter() == [True, 1, list(PRELOADED)]


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="counts threads in /proc")
def test_a_users_own_allocator_setting_leaves_the_imports_to_the_workers() -> None:
    assert _preload_in_a_fresh_interpreter(
        JE_ARROW_MALLOC_CONF="background_thread:true") == [False, 1, []]


def test_the_collection_after_each_task_leaves_the_oldest_generation_alone() -> None:
    daemon = types.ModuleType("daemon")
    daemon.__dict__["gc"] = gc
    use_young_collections(daemon)
    generations: list[int] = []

    def seen(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            generations.append(info["generation"])

    gc.callbacks.append(seen)
    try:
        daemon.gc.collect()
    finally:
        gc.callbacks.remove(seen)
    assert generations == [1]


def test_pyspark_still_collects_after_each_task_through_its_module_gc() -> None:
    # The shim above only works while pyspark.daemon calls `gc.collect()` on the
    # module it imported as `gc`.
    import pyspark.daemon

    source = inspect.getsource(pyspark.daemon)
    assert "import gc\n" in source
    assert "gc.collect()" in source


@pytest.mark.spark
def test_workers_fork_from_our_daemon_with_the_installed_pyspark(spark: Any) -> None:
    facts = spark.sparkContext.parallelize(range(2), 2).mapPartitions(_worker_facts).collect()
    assert len(facts) == 2
    for pyspark_file, frozen, main, zips, argv, after_task_gc, preloaded in facts:
        assert main == "tickwheel.pipeline._spark_daemon"
        assert after_task_gc == "YoungCollections"
        assert preloaded
        assert zips == []
        assert ".zip" not in pyspark_file  # bytecode from the installed package
        assert frozen > 0  # the daemon's heap, frozen before the fork
        if os.environ["PYSPARK_PYTHON"] == launcher():  # not chosen by whoever runs this
            assert argv[1] == launcher()


@pytest.mark.spark
def test_a_local_jvm_runs_with_the_local_options(spark: Any) -> None:
    runtime = spark._jvm.java.lang.management.ManagementFactory.getRuntimeMXBean()
    arguments = list(runtime.getInputArguments())
    for option in LOCAL_JAVA_OPTIONS.split():
        assert option in arguments
    # Shuffle blocks stay on this machine: not compressed.
    assert spark.sparkContext.getConf().get("spark.shuffle.compress") == "false"


@pytest.mark.parametrize(("mode", "offered"), [
    ("always [madvise] never\n", True),
    ("[always] madvise never\n", True),
    ("always madvise [never]\n", False),
    ("", False),
])
def test_huge_pages_are_asked_for_only_where_the_kernel_hands_them_out_on_request(
        tmp_path: Path, mode: str, offered: bool) -> None:
    mode_file = tmp_path / "enabled"
    mode_file.write_text(mode)
    assert huge_pages_on_request(mode_file) is offered
    assert huge_pages_on_request(tmp_path / "no-such-file") is False


@pytest.mark.parametrize(("tunables", "expected"), [
    (None, "glibc.malloc.hugetlb=1"),
    ("", "glibc.malloc.hugetlb=1"),
    ("glibc.malloc.arena_max=2", "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1"),
    # The user's own choice, even "no", is kept.
    ("glibc.malloc.hugetlb=0", "glibc.malloc.hugetlb=0"),
    ("glibc.malloc.arena_max=2:glibc.malloc.hugetlb=2",
     "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=2"),
])
def test_malloc_is_asked_for_huge_pages_on_top_of_the_users_own_tunables(
        tunables: str | None, expected: str) -> None:
    assert with_huge_page_malloc(tunables) == expected


def _malloc_tunables(_rows: Iterator[Any]) -> Iterator[str | None]:
    yield os.environ.get("GLIBC_TUNABLES")


@pytest.mark.spark
@pytest.mark.skipif(not huge_pages_on_request(),
                    reason="this kernel hands out no transparent huge pages on request")
def test_a_local_jvm_and_its_workers_ask_for_huge_pages(spark: Any) -> None:
    runtime = spark._jvm.java.lang.management.ManagementFactory.getRuntimeMXBean()
    assert "-XX:+UseTransparentHugePages" in list(runtime.getInputArguments())
    tunables = spark.sparkContext.parallelize(range(2), 2).mapPartitions(
        _malloc_tunables).collect()
    assert len(tunables) == 2
    for worker in tunables:
        assert worker is not None
        assert "glibc.malloc.hugetlb=" in worker
    # Only the JVM's launch got the setting: this process's later children do not.
    assert os.environ.get("GLIBC_TUNABLES") == _TUNABLES_BEFORE_ANY_SESSION


@pytest.mark.parametrize("before", [None, "glibc.malloc.arena_max=2"])
def test_the_launch_environment_is_put_back(monkeypatch: pytest.MonkeyPatch,
                                            before: str | None) -> None:
    if before is None:
        monkeypatch.delenv("GLIBC_TUNABLES", raising=False)
    else:
        monkeypatch.setenv("GLIBC_TUNABLES", before)
    with environment_variable("GLIBC_TUNABLES", "glibc.malloc.hugetlb=1"):
        assert os.environ["GLIBC_TUNABLES"] == "glibc.malloc.hugetlb=1"
    assert os.environ.get("GLIBC_TUNABLES") == before


def _daemons_of(jvm_pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:  # gone meanwhile
            continue
        parent = int(stat.rsplit(")", 1)[1].split()[1])
        if parent == jvm_pid and b"tickwheel.pipeline._spark_daemon" in cmdline:
            found.append(int(entry.name))
    return found


@pytest.mark.spark
@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads Linux's /proc")
def test_the_packers_and_the_processor_share_one_pool_of_workers(spark: Any,
                                                                  tmp_path: Path) -> None:
    from tickwheel.pipeline.spark_engine import SparkEngine

    events = tmp_path / "events"
    events.mkdir()
    (events / "e.jsonl").write_text(
        '{"ts_ms": 1, "type": "watch", "op_id": "a", "keys": ["k"], "deadline_ms": 50,'
        ' "condition": "any_update"}\n{"ts_ms": 2, "type": "update", "key": "k", "value": 1}\n')
    result = SparkEngine(spark, events, tmp_path / "out", tmp_path / "ckpt").run()
    assert result.rows_applied == 2
    jvm_pid = int(spark._jvm.java.lang.ProcessHandle.current().pid())
    # The session's first run also started workers alongside its query (see the
    # next test): they too came from this one pool.
    assert len(_daemons_of(jvm_pid)) == 1


@pytest.mark.spark
def test_the_first_run_of_a_session_warms_up_the_workers_and_later_runs_do_not(
        spark: Any, tmp_path: Path) -> None:
    from tickwheel.pipeline import spark_engine
    from tickwheel.pipeline.spark_engine import SparkEngine

    events = tmp_path / "events"
    events.mkdir()
    (events / "e.jsonl").write_text('{"ts_ms": 1, "type": "update", "key": "k", "value": 1}\n')
    engine = SparkEngine(spark, events, tmp_path / "out", tmp_path / "ckpt")
    context = spark.sparkContext
    was_warmed = context in spark_engine._WARMED_CONTEXTS
    spark_engine._WARMED_CONTEXTS.discard(context)
    try:
        warm_up = engine._warm_up_python_workers()
        assert warm_up is not None
        warm_up.join(timeout=120)
        assert not warm_up.is_alive()
        assert context in spark_engine._WARMED_CONTEXTS
        assert engine._warm_up_python_workers() is None
        assert engine.run().rows_applied == 1
    finally:
        if was_warmed:
            spark_engine._WARMED_CONTEXTS.add(context)


def _processes_started_by_the_jvm(spark: Any, run: Any, recording: Path) -> list[str]:
    """The command lines of the processes the JVM starts while ``run()`` runs, as
    its flight recorder sees them."""
    jvm = spark._jvm
    flight = jvm.jdk.jfr.Recording()
    flight.enable("jdk.ProcessStart")
    flight.start()
    try:
        run()
    finally:
        flight.stop()
    where = jvm.java.io.File(str(recording)).toPath()
    flight.dump(where)
    flight.close()
    events = jvm.jdk.jfr.consumer.RecordingFile.readAllEvents(where)
    return [str(event.getString("command")) for event in events]


@pytest.mark.spark
def test_the_checkpoint_is_written_without_a_process_per_file(spark: Any,
                                                             tmp_path: Path) -> None:
    from tickwheel.pipeline.spark_engine import SparkEngine

    events = tmp_path / "events"
    events.mkdir()
    for n in range(3):
        (events / f"e{n}.jsonl").write_text(
            f'{{"ts_ms": {n}, "type": "update", "key": "k", "value": {n}}}\n')
    engine = SparkEngine(spark, events, tmp_path / "out", tmp_path / "ckpt",
                         max_files_per_trigger=1)
    commands = _processes_started_by_the_jvm(spark, engine.run, tmp_path / "run.jfr")
    written = [p for p in (tmp_path / "ckpt" / "query").rglob("*") if p.is_file()]
    assert engine.batches >= 3 and len(written) > 20
    # Hadoop asks for a path's link status by running readlink (without its native
    # library): four times for every file Spark's default manager renames into place.
    assert [c for c in commands if c.startswith("readlink")] == []


def test_a_processor_shipped_to_a_worker_keeps_shards_where_the_next_task_finds_them(
) -> None:
    from pyspark import cloudpickle

    from tickwheel.pipeline import _worker_state
    from tickwheel.pipeline._spark_tasks import processor_class

    # Spark ships the processor by value; a dict it named directly came along as a
    # copy, new for every task.
    shipped = cloudpickle.loads(cloudpickle.dumps(processor_class()([0, 1], 10, None, 1)))
    names = type(shipped)._loaded.__globals__
    assert names["_worker_state"] is _worker_state
    assert [name for name, value in names.items()
            if isinstance(value, dict) and name != "__builtins__"] == []
