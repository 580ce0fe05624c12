"""A Spark session with what the engine needs, through Spark's documented settings
only: the RocksDB state store (``transformWithState`` requires it), the Python that
runs the workers, and, for a master on this machine, a driver that listens on
loopback only.

A session this module starts launches its JVM with its standard output and error
going to the log instead of the terminal: Spark's errors at ERROR, its warnings at
INFO, anything else (the lines PySpark's ``transformWithStateInPandas`` driver worker
prints whenever a query starts, the JVM's start-up notes) at DEBUG. A command's own
output is then not interleaved with Spark's, and ``logging`` decides what is shown."""

from __future__ import annotations

import contextlib
import logging
import os
import re
import subprocess
import sys
import threading
from collections import deque
from collections.abc import Iterator, Mapping
from typing import IO, TYPE_CHECKING, Any

from tickwheel.pipeline.contract.limits import (
    DEFAULT_DRIVER_MEMORY,
    check_driver_memory,
    check_spark_setting_names,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["ROCKSDB", "spark_session", "stop_spark"]

log = logging.getLogger(__name__)

ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
#: Whether this process has launched its JVM here: PySpark keeps one JVM per process,
#: and a session started after one was stopped runs on the same.
_launched = False
#: The JVM this module launched (its gateway, and the thread reading its output), until
#: :func:`stop_spark` ends it.
_jvm: tuple[Any, _JvmOutput] | None = None
#: Set once :func:`stop_spark` ended the JVM: PySpark cannot start another in this
#: process.
_jvm_ended = False


def spark_session(master: str | None = "local[2]", app_name: str = "tickwheel",
                  driver_memory: str = DEFAULT_DRIVER_MEMORY,
                  python: str | None = None,
                  settings: Mapping[str, str] | None = None) -> SparkSession:
    """A session for the engine. ``python`` runs the Python workers (the executors'
    ``spark.pyspark.python``); by default this interpreter for a master on this
    machine, and Spark's own setting (``PYSPARK_PYTHON`` or its defaults file)
    otherwise, since a cluster's executors have their own.

    ``settings`` are Spark settings of the user's (``spark.executor.memory``, say), as
    spark-submit's ``--conf`` gives them; they take the place of this function's own
    defaults, and a reserved one is refused (see
    :func:`~tickwheel.pipeline.contract.limits.check_spark_setting_names`). Like the JVM's memory,
    they apply to a session whose context starts here.

    ``master=None`` takes the master, the JVM's memory and any other setting from
    ``spark-submit`` (its JVM is up before this runs) or Spark's defaults file, and
    adds only what the engine needs; see :mod:`tickwheel.pipeline.spark.job`."""
    from pyspark.sql import SparkSession

    if _jvm_ended:
        raise RuntimeError("this process ended its Spark JVM (stop_spark): start Spark "
                           "in a new process")
    check_driver_memory(driver_memory)
    given = check_spark_setting_names(settings or {})
    is_local = master is not None and master.startswith("local")
    conf: dict[str, str] = {}
    if master is not None:  # an embedded session; spark-submit's user chooses these
        conf.update({"spark.master": master, "spark.app.name": app_name,
                     "spark.driver.memory": driver_memory,
                     "spark.ui.enabled": "false",
                     "spark.ui.showConsoleProgress": "false"})
    if is_local:
        # Everything of a local master is on this machine: its driver listens on
        # loopback only, not on whatever address the host name resolves to.
        conf.update({"spark.driver.bindAddress": "127.0.0.1",
                     "spark.driver.host": "127.0.0.1"})
    if python is None and master is not None and master.startswith(("local", "spark://")):
        python = os.environ.get("PYSPARK_PYTHON", sys.executable)
    python = given.get("spark.pyspark.python", python)
    if python is not None:
        conf["spark.pyspark.python"] = python
    conf["spark.sql.execution.arrow.maxRecordsPerBatch"] = "20000"
    conf.update(given)
    conf["spark.sql.streaming.stateStore.providerClass"] = ROCKSDB
    builder = SparkSession.builder
    for name, value in conf.items():
        builder = builder.config(name, value)
    launch: dict[str, str] = {} if python is None else {"PYSPARK_PYTHON": python}
    if is_local and "SPARK_LOCAL_IP" not in os.environ \
            and "spark.driver.bindAddress" not in given:
        # A local master's UI too, if asked for, listens on loopback only.
        launch["SPARK_LOCAL_IP"] = "127.0.0.1"
    with _launch_environment(launch):
        if (master is not None and not _launched
                and SparkSession.getActiveSession() is None):
            _start_context(conf)
        spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def _start_context(settings: dict[str, str]) -> None:
    """Start the session's context on a JVM whose output is read into the log,
    through PySpark's own ``launch_gateway(popen_kwargs=...)`` and
    ``SparkContext(gateway=...)``; the builder then finds the context running."""
    from pyspark import SparkConf, SparkContext
    from pyspark.java_gateway import launch_gateway

    global _launched, _jvm
    conf = SparkConf().setAll(list(settings.items()))
    read_end, write_end = os.pipe()
    reader = _JvmOutput(os.fdopen(read_end, "rb"))
    try:
        gateway = launch_gateway(  # type: ignore[no-untyped-call]
            conf, popen_kwargs={"stdout": write_end, "stderr": write_end})
    except BaseException as failure:
        os.close(write_end)
        reader.join(timeout=5)
        raise RuntimeError("Spark's JVM did not start:\n" + "\n".join(reader.last)) \
            from failure
    os.close(write_end)
    _launched = True
    _jvm = (gateway, reader)
    SparkContext(conf=conf, gateway=gateway)


def stop_spark(spark: SparkSession, timeout_s: float = 60.0) -> int | None:
    """Stop ``spark`` and, where :func:`spark_session` launched the JVM, end the JVM
    too, and read its output to the end; returns the JVM's exit status (None when this
    module did not launch it).

    The last use of Spark in a process, before it exits: without it the JVM outlives
    the session, and its shutdown lines reach the thread that logs them while the
    interpreter is exiting. A daemon thread that writes to the terminal then can hold
    the stream's lock as the interpreter flushes it, and CPython aborts the process
    (``Fatal Python error: _enter_buffered_busy``, exit by SIGABRT) after all its work
    is done."""
    global _jvm, _jvm_ended
    spark.stop()
    launched = _jvm
    if launched is None:
        return None
    gateway, reader = launched
    _jvm, _jvm_ended = None, True
    with contextlib.suppress(Exception):  # its connections may be gone already
        gateway.shutdown()
    proc = gateway.proc
    if proc.stdin is not None:  # Spark's gateway server exits at the end of its input
        with contextlib.suppress(OSError):
            proc.stdin.close()
    try:
        status: int = proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        log.warning("Spark's JVM did not exit within %.0f s of its session's stop: "
                    "killed", timeout_s)
        proc.kill()
        status = proc.wait()
    reader.join(timeout_s)
    return status


#: A line log4j starts (Spark's default layout: date, time, level).
_LOG4J = re.compile(r"\d\d/\d\d/\d\d \d\d:\d\d:\d\d (ERROR|WARN|INFO|DEBUG|TRACE) ")
_LEVELS = {"ERROR": logging.ERROR, "WARN": logging.INFO}


class _JvmOutput(threading.Thread):
    """Reads the JVM's output as it comes (a full pipe would block it) into the log.
    A log4j line sets the level of the lines that follow it (a stack trace); any other
    line is DEBUG. Keeps the last lines for an error that must show them."""

    def __init__(self, stream: IO[bytes]) -> None:
        super().__init__(name="tickwheel-spark-jvm-output", daemon=True)
        self.stream = stream
        self.last: deque[str] = deque(maxlen=20)
        self.start()

    def run(self) -> None:
        level = logging.DEBUG
        with self.stream:
            for line in self.stream:
                text = line.decode("utf-8", "replace").rstrip()
                if not text:
                    continue
                self.last.append(text)
                header = _LOG4J.match(text)
                if header is not None:
                    level = _LEVELS.get(header.group(1), logging.DEBUG)
                elif not text[:1].isspace():
                    level = logging.DEBUG
                log.log(level, "spark: %s", text)


@contextlib.contextmanager
def _launch_environment(settings: Mapping[str, str]) -> Iterator[None]:
    """The variables the JVM reads at launch, set for that moment, then as they were
    (PySpark builds the JVM's environment from this process's). ``PYSPARK_PYTHON``:
    PySpark takes its workers' Python from it alone (``spark.pyspark.python`` is read by
    spark-submit, which sets it). ``SPARK_LOCAL_IP``: the web UI binds to it, or to
    every interface; no setting moves it."""
    saved = {name: os.environ.get(name) for name in settings}
    os.environ.update(settings)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                del os.environ[name]
            else:
                os.environ[name] = value
