"""A Spark session set up for the engine: what the engine needs on any master, and
what a local master needs on a machine of a few cores (the JVM's options, huge
pages, the class archive, the Python workers' interpreter and daemon)."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from tickwheel.pipeline._spark_python import launcher
from tickwheel.pipeline.class_archive import archive_options

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["HUGE_PAGE_JAVA_OPTION", "LOCAL_JAVA_OPTIONS", "ROCKSDB", "environment_variable",
           "huge_pages_on_request", "spark_session", "with_huge_page_malloc"]

ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"

#: The driver JVM's options in local mode. One JVM does all of Spark's work there, on
#: the same few cores as the Python workers, and a run of a few minutes never pays
#: back the C2 compiler's threads: with C1 only and the parallel collector the JVM
#: used 39-44 s of CPU instead of 52-69 s for a cold 1M-event run on 2 cores (three
#: runs each), and warm runs were no slower. Clusters keep their own settings.
LOCAL_JAVA_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseParallelGC"

# Huge pages for a local JVM and its Python workers, where the kernel hands them out
# on request (transparent huge pages in ``madvise`` or ``always`` mode). A cold run
# spends much of its system time faulting in fresh 4 KiB pages and zeroing them: the
# JVM's heap as it grows, and the malloc'd buffers of Arrow, Netty and RocksDB in the
# JVM and of the workers, which glibc hands back to the kernel and takes again batch
# after batch. In a cold 1M-event run on local[2] the JVM took 732k page faults (83k
# with huge pages) and its workers 535k (299k); its time fell from 11.1-11.3 s to
# 9.4-10.7 s (three pairs of runs), and warm runs were 2-15% faster.
_THP_MODE_FILE = Path("/sys/kernel/mm/transparent_hugepage/enabled")
HUGE_PAGE_JAVA_OPTION = "-XX:+UseTransparentHugePages"
_HUGE_PAGE_MALLOC = "glibc.malloc.hugetlb"


def huge_pages_on_request(mode_file: Path = _THP_MODE_FILE) -> bool:
    """Whether a process may ask for transparent huge pages: the kernel's mode (the
    bracketed word of ``always [madvise] never``) is not ``never``. Without them the
    JVM would print a warning at start."""
    try:
        mode = mode_file.read_text()
    except OSError:  # not Linux, or no THP in this kernel
        return False
    return "[" in mode and "[never]" not in mode


def with_huge_page_malloc(tunables: str | None) -> str:
    """``GLIBC_TUNABLES`` asking glibc's malloc (2.35 and later; older ones ignore it)
    to back its arenas and large blocks with huge pages; a user's own
    ``glibc.malloc.hugetlb`` stays as it is, and so do their other tunables."""
    if not tunables:
        return f"{_HUGE_PAGE_MALLOC}=1"
    if any(t.split("=", 1)[0] == _HUGE_PAGE_MALLOC for t in tunables.split(":")):
        return tunables
    return f"{tunables}:{_HUGE_PAGE_MALLOC}=1"


@contextlib.contextmanager
def environment_variable(name: str, value: str) -> Iterator[None]:
    """``name=value`` for the processes started meanwhile (the JVM, and through it its
    Python workers), not for this process's own later children."""
    old = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            del os.environ[name]
        else:
            os.environ[name] = old


def spark_session(master: str | None = "local[2]", app_name: str = "tickwheel",
                  driver_memory: str = "4g", jvm_log: Path | None = None,
                  java_options: str | None = None) -> SparkSession:
    """A session with what the engine needs: the RocksDB state store (required by
    ``transformWithState``), this interpreter for Python workers (unless
    ``PYSPARK_PYTHON`` says otherwise), quiet logs.

    With ``jvm_log``, a JVM started here writes its console output there instead of
    this process's terminal: its start-up warnings, and the lines PySpark's
    transformWithState driver worker prints for every query.

    ``java_options`` become ``spark.driver.extraJavaOptions``; by default, for a
    ``local`` master, :data:`LOCAL_JAVA_OPTIONS` and the class archive if one has been
    made (see :mod:`tickwheel.pipeline.class_archive`), and nothing otherwise. Like
    ``driver_memory``, they apply only to a JVM this call starts. A ``local`` master
    also leaves shuffle blocks uncompressed, and where the kernel offers transparent
    huge pages on request, its JVM (``-XX:+UseTransparentHugePages``, by default) and
    Python workers (``GLIBC_TUNABLES``) use them.

    ``master=None`` takes the master, the JVM's memory and options and any other
    setting from ``spark-submit`` (its JVM is up before this runs) or Spark's defaults
    file, and adds only what the engine needs; see :mod:`tickwheel.spark_job`."""
    if "PYSPARK_PYTHON" not in os.environ:
        # Workers of a local master run this interpreter; tickwheel-spark-python
        # starts it with the installed PySpark's bytecode instead of its zips.
        local = launcher() if master is not None and master.startswith("local") else None
        os.environ["PYSPARK_PYTHON"] = local or sys.executable
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    is_local = master is not None and master.startswith("local")
    huge_pages = is_local and huge_pages_on_request()
    if java_options is None and is_local:
        java_options = " ".join(
            option for option in (LOCAL_JAVA_OPTIONS,
                                  HUGE_PAGE_JAVA_OPTION if huge_pages else "",
                                  archive_options()) if option)
    builder = SparkSession.builder
    if master is not None:  # an embedded session; spark-submit's user chooses these
        builder = (builder.master(master).appName(app_name)
                   .config("spark.driver.memory", driver_memory)
                   .config("spark.ui.enabled", "false")
                   .config("spark.ui.showConsoleProgress", "false"))
    if is_local:
        # Everything of a local master is on this machine: its driver listens on
        # loopback only, not on whatever address the host name resolves to.
        builder = (builder.config("spark.driver.bindAddress", "127.0.0.1")
                   .config("spark.driver.host", "127.0.0.1"))
    builder = (builder
               .config("spark.sql.streaming.stateStore.providerClass", ROCKSDB)
               .config("spark.sql.execution.arrow.maxRecordsPerBatch", "20000")
               .config("spark.python.daemon.module", "tickwheel.pipeline._spark_daemon"))
    if java_options:
        builder = builder.config("spark.driver.extraJavaOptions", java_options)
    if is_local:
        # Shuffle blocks never leave this machine, so compressing them (lz4, the
        # chunks' marshal'd rows every micro-batch) only spent CPU on the cores the
        # workers need: a 1M-event run took 10% less time cold and 16% warm without
        # it (three pairs of runs on local[2]).
        builder = builder.config("spark.shuffle.compress", "false")
    with contextlib.ExitStack() as launch:
        if jvm_log is not None:
            launch.enter_context(_console_output_to(jvm_log))
        if huge_pages:
            launch.enter_context(environment_variable(
                "GLIBC_TUNABLES", with_huge_page_malloc(os.environ.get("GLIBC_TUNABLES"))))
        spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


@contextlib.contextmanager
def _console_output_to(path: Path) -> Iterator[None]:
    """Point this process's stdout and stderr file descriptors at ``path`` for a while:
    a child started meanwhile (the JVM) keeps them, this process gets its own back."""
    path.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.dup2(target, 1)
        os.dup2(target, 2)
        yield
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in (*saved, target):
            os.close(fd)
