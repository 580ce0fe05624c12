"""A Spark session with what the engine needs, through Spark's documented settings
only: the RocksDB state store (``transformWithState`` requires it), the Python that
runs the workers, and, for a master on this machine, a driver that listens on
loopback only."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["ROCKSDB", "spark_session"]

ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"


def spark_session(master: str | None = "local[2]", app_name: str = "tickwheel",
                  driver_memory: str = "4g", python: str | None = None) -> SparkSession:
    """A session for the engine. ``python`` runs the Python workers (the executors'
    ``spark.pyspark.python``); by default this interpreter for a master on this
    machine, and Spark's own setting (``PYSPARK_PYTHON`` or its defaults file)
    otherwise, since a cluster's executors have their own.

    ``master=None`` takes the master, the JVM's memory and any other setting from
    ``spark-submit`` (its JVM is up before this runs) or Spark's defaults file, and
    adds only what the engine needs; see :mod:`tickwheel.spark_job`."""
    from pyspark.sql import SparkSession

    is_local = master is not None and master.startswith("local")
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
    if python is None and master is not None and master.startswith(("local", "spark://")):
        python = os.environ.get("PYSPARK_PYTHON", sys.executable)
    if python is not None:
        builder = builder.config("spark.pyspark.python", python)
    builder = (builder
               .config("spark.sql.streaming.stateStore.providerClass", ROCKSDB)
               .config("spark.sql.execution.arrow.maxRecordsPerBatch", "20000"))
    with _workers_python(python):
        spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


@contextlib.contextmanager
def _workers_python(python: str | None) -> Iterator[None]:
    """PySpark takes the Python of its workers from ``PYSPARK_PYTHON`` alone, once, when
    the session's context starts (``spark.pyspark.python`` is read by spark-submit,
    which sets the variable): set for that moment, then as it was."""
    if python is None:
        yield
        return
    old = os.environ.get("PYSPARK_PYTHON")
    os.environ["PYSPARK_PYTHON"] = python
    try:
        yield
    finally:
        if old is None:
            del os.environ["PYSPARK_PYTHON"]
        else:
            os.environ["PYSPARK_PYTHON"] = old
