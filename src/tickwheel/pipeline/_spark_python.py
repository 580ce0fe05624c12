"""The interpreter a local Spark starts its Python processes with.

Spark puts ``$SPARK_HOME/python/lib/pyspark.zip`` (and py4j's zip) first on the path
of every Python process it starts, and a zip holds no bytecode: each process compiles
the PySpark modules it imports again. Forked workers are spared by
:mod:`tickwheel.pipeline._spark_daemon`; the processes Spark starts on their own are
not, and ``transformWithStateInPandas`` starts one per query on the driver, on the
query's critical path, whose imports took 0.84 s from the zip against 0.18 s from the
installed package (measured on this project's 2-core machine).

``spark_session`` names the ``tickwheel-spark-python`` command (this module's
:func:`main`) as ``PYSPARK_PYTHON`` for a local master, when the caller has not chosen
one: it runs ``-m module args...`` as ``python -m`` would, in this interpreter, with
the zips off the path when they are copies of the installed ``pyspark``. Anything
else it hands to the interpreter unchanged.
"""

from __future__ import annotations

import importlib.machinery
import os
import runpy
import sys
from pathlib import Path

__all__ = ["LAUNCHER", "drop_bundled_zips", "launcher", "main", "without_bundled_zips"]

LAUNCHER = "tickwheel-spark-python"


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


def drop_bundled_zips() -> None:
    """Apply :func:`without_bundled_zips` to this process's ``sys.path``."""
    path = without_bundled_zips(sys.path)
    if path != sys.path:
        # Gone from the cache of importers too: PySpark's workers call
        # importlib.invalidate_caches() for every task, and a zip importer then reads
        # its zip's directory again (a thousand entries for pyspark.zip).
        for entry in _spark_zips(sys.path):
            sys.path_importer_cache.pop(entry, None)
        sys.path[:] = path


def _spark_zips(path: list[str]) -> list[str]:
    return [p for p in path
            if p.endswith(".zip") and os.path.basename(p).startswith(("pyspark", "py4j"))]


def launcher() -> str | None:
    """The launcher command installed next to this interpreter, if there is one."""
    here = Path(sys.executable).parent
    for name in (LAUNCHER, f"{LAUNCHER}.exe"):
        if (here / name).is_file():
            return str(here / name)
    return None


def main() -> None:
    args = sys.argv[1:]
    if len(args) < 2 or args[0] != "-m":
        os.execv(sys.executable, [sys.executable, *args])
    module = args[1]
    # As `python -m` does: the working directory first on the path, not this
    # script's, and the module's own arguments in sys.argv.
    sys.path[0] = os.getcwd()
    sys.argv[1:] = args[2:]
    drop_bundled_zips()
    runpy.run_module(module, run_name="__main__", alter_sys=True)
