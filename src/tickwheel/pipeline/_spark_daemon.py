"""PySpark's worker daemon, started so that its workers start fast.

``spark_session`` names this module as ``spark.python.daemon.module``. It runs
``pyspark.daemon`` unchanged, after two things a fork-based daemon is meant for:

- Spark puts ``$SPARK_HOME/python/lib/pyspark.zip`` first on the workers' path, and a
  zip holds no bytecode, so every worker compiled PySpark's sources again: importing
  ``pyspark.worker`` took 1.5 s from the zip against 0.25 s from the installed package
  (measured on this project's 2-core machine). When the zips are the ones shipped
  inside the installed ``pyspark`` (a pip install, as here), they are copies of it
  and leave the path. A Spark distribution with its own zips keeps them first.
- ``pyspark.worker`` is imported once, here, and every forked worker inherits it. It
  starts no thread (checked); pandas and pyarrow do, which is why PySpark imports
  them only after the fork, and so does this.

Then ``gc.freeze()``, as the ``gc`` documentation advises before forking: the
daemon's objects move to a generation no collection walks, which keeps the pages
they live on shared with the workers.
"""

from __future__ import annotations

import gc
import importlib.machinery
import os
import sys

__all__ = ["without_bundled_zips"]


def without_bundled_zips(path: list[str]) -> list[str]:
    """``path`` without PySpark's zips if they ship inside the ``pyspark`` package
    found on the rest of the path; otherwise ``path`` unchanged."""
    zips = _spark_zips(path)
    if not zips:
        return path
    rest = [p for p in path if p not in zips]
    spec = importlib.machinery.PathFinder.find_spec("pyspark", rest)
    if spec is None or spec.origin is None:
        return path
    package = os.path.dirname(os.path.realpath(spec.origin)) + os.sep
    if not all(os.path.realpath(z).startswith(package) for z in zips):
        return path
    return rest


def _spark_zips(path: list[str]) -> list[str]:
    return [p for p in path
            if p.endswith(".zip") and os.path.basename(p).startswith(("pyspark", "py4j"))]


def main() -> None:
    path = without_bundled_zips(sys.path)
    if path != sys.path:
        # Gone from the cache of importers too: PySpark's workers call
        # importlib.invalidate_caches() for every task, and a zip importer then reads
        # its zip's directory again (a thousand entries for pyspark.zip).
        for entry in _spark_zips(sys.path):
            sys.path_importer_cache.pop(entry, None)
        sys.path[:] = path
    import pyspark.worker  # noqa: F401 - inherited by every forked worker
    from pyspark import daemon

    gc.collect()
    gc.freeze()
    daemon.manager()


if __name__ == "__main__":
    main()
