"""PySpark's worker daemon, started so that its workers start fast.

``spark_session`` names this module as ``spark.python.daemon.module``. It runs
``pyspark.daemon`` unchanged, after two things a fork-based daemon is meant for:

- PySpark's zips leave the path when they are copies of the installed package (see
  :mod:`tickwheel.pipeline._spark_python`): importing ``pyspark.worker`` took 1.5 s
  from the zip against 0.25 s from the installed package, in every worker.
- ``pyspark.worker`` is imported once, here, and every forked worker inherits it. It
  starts no thread (checked).
- So are pyarrow and pandas, which every worker of the engine imports (its packers
  take Arrow batches, its processor pandas frames): 0.25-0.3 s in every worker, on
  the way to its first task, in both the cold run's stages. They start threads on
  import, which is why PySpark imports them only after the fork: pyarrow's jemalloc
  a background thread, numpy's OpenBLAS its pool. Here neither does
  (:func:`preload`): jemalloc purges on its allocation paths instead and OpenBLAS
  runs on the calling thread, as a worker running one task on one core would
  anyway. A variable the user has set is left alone; if the daemon then holds a
  thread, :func:`preload` imports nothing.

Then ``gc.freeze()``, as the ``gc`` documentation advises before forking: the
daemon's objects move to a generation no collection walks, which keeps the pages
they live on shared with the workers.

And the collection PySpark runs in a worker after every task it finishes walks the
young generations only (see :func:`use_young_collections`).
"""

from __future__ import annotations

import gc
import importlib
import os
from types import ModuleType

from tickwheel.pipeline._spark_python import drop_bundled_zips

__all__ = ["PRELOADED", "YoungCollections", "main", "preload", "use_young_collections"]

#: Imported by :func:`preload`, in this order.
PRELOADED = ("pyarrow", "pandas", "tickwheel.pipeline._spark_tasks")

# What the libraries behind PRELOADED read when they load: no background thread for
# the jemalloc pyarrow bundles (its variable has pyarrow's prefix), one thread for
# OpenBLAS, which numpy loads.
_NO_THREADS = {"JE_ARROW_MALLOC_CONF": "background_thread:false",
               "OPENBLAS_NUM_THREADS": "1"}


def _threads() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:  # not Linux: nothing to count threads with cheaply
        return 0


def preload() -> bool:
    """Import :data:`PRELOADED` for every worker to inherit, if that starts no thread
    (True when it did the imports)."""
    for name, value in _NO_THREADS.items():
        if os.environ.setdefault(name, value) != value:
            return False  # the user's choice, which may start a thread
    if _threads() != 1:
        return False
    for module in PRELOADED:
        importlib.import_module(module)
    return True


class YoungCollections:
    """``gc`` as ``pyspark.daemon`` sees it: its ``collect()`` collects generations 0
    and 1, never the oldest."""

    @staticmethod
    def collect(generation: int = 2) -> int:
        return gc.collect(min(generation, 1))


def use_young_collections(daemon: ModuleType) -> None:
    """Make the collection ``daemon`` runs after every task a young one.

    A reused worker keeps its shards between tasks (pending operations, seen op ids:
    hundreds of thousands of objects), and a full collection after each task walked
    them all again: in a cold and a warm run of the 1M-event benchmark on local[2],
    46 such collections took 5.8 s of the workers' CPU (timed with ``gc.callbacks``),
    against 0.75 s for every collection of the pair with young ones. The oldest
    generation is still collected on the interpreter's own thresholds (4 times in
    that pair), so cyclic garbage, such as a shard state a newer one replaced, is
    still freed.
    """
    vars(daemon)["gc"] = YoungCollections()


def main() -> None:
    # Already done when tickwheel-spark-python started this process, but not when
    # PYSPARK_PYTHON names a plain interpreter.
    drop_bundled_zips()
    import pyspark.worker  # noqa: F401 - inherited by every forked worker
    from pyspark import daemon

    preload()
    gc.collect()
    gc.freeze()
    use_young_collections(daemon)
    daemon.manager()


if __name__ == "__main__":
    main()
