"""PySpark's worker daemon, started so that its workers start fast.

``spark_session`` names this module as ``spark.python.daemon.module``. It runs
``pyspark.daemon`` unchanged, after two things a fork-based daemon is meant for:

- PySpark's zips leave the path when they are copies of the installed package (see
  :mod:`tickwheel.pipeline._spark_python`): importing ``pyspark.worker`` took 1.5 s
  from the zip against 0.25 s from the installed package, in every worker.
- ``pyspark.worker`` is imported once, here, and every forked worker inherits it. It
  starts no thread (checked); pandas and pyarrow do, which is why PySpark imports
  them only after the fork, and so does this.

Then ``gc.freeze()``, as the ``gc`` documentation advises before forking: the
daemon's objects move to a generation no collection walks, which keeps the pages
they live on shared with the workers.
"""

from __future__ import annotations

import gc

from tickwheel.pipeline._spark_python import drop_bundled_zips

__all__ = ["main"]


def main() -> None:
    # Already done when tickwheel-spark-python started this process, but not when
    # PYSPARK_PYTHON names a plain interpreter.
    drop_bundled_zips()
    import pyspark.worker  # noqa: F401 - inherited by every forked worker
    from pyspark import daemon

    gc.collect()
    gc.freeze()
    daemon.manager()


if __name__ == "__main__":
    main()
