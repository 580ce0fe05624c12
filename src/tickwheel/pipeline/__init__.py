"""The purgatory over event streams. Subpackages, lowest first (nothing imports one
listed after it): :mod:`.contract` (rows, outcomes, options, routing), :mod:`.semantics`
(what decides outcomes), :mod:`.io` (input, outputs, files), :mod:`.state` (what is kept
between batches), :mod:`.delivery` (outcomes handed on), :mod:`.engines` (the Spark-free
engines), :mod:`.spark` (the Spark engine) and :mod:`.tools` (generator, reports).

The names users reach for are here too, imported when first used (the engines need
the ``cli`` extra's pyarrow, the Spark engine the ``spark`` extra)::

    from tickwheel.pipeline import LocalFollowEngine, OutcomeRow, OutcomeSink
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tickwheel.pipeline.contract.events import OutcomeKind
    from tickwheel.pipeline.contract.outcomes import OutcomeRow
    from tickwheel.pipeline.delivery.sink import OutcomeSink, deliver_outcomes
    from tickwheel.pipeline.engines.follow import LocalFollowEngine
    from tickwheel.pipeline.engines.following import wall_clock_ms
    from tickwheel.pipeline.engines.partitioned import run_partitioned
    from tickwheel.pipeline.engines.reference import ReferenceEngine
    from tickwheel.pipeline.semantics.partition import CommittedChanges
    # SparkEngine is left out here: the compiled build type-checks this package
    # without PySpark installed.

__all__ = ["CommittedChanges", "LocalFollowEngine", "OutcomeKind", "OutcomeRow",
           "OutcomeSink", "ReferenceEngine", "SparkEngine", "deliver_outcomes",
           "run_partitioned", "wall_clock_ms"]

_HOMES = {
    "CommittedChanges": "tickwheel.pipeline.semantics.partition",
    "LocalFollowEngine": "tickwheel.pipeline.engines.follow",
    "OutcomeKind": "tickwheel.pipeline.contract.events",
    "OutcomeRow": "tickwheel.pipeline.contract.outcomes",
    "OutcomeSink": "tickwheel.pipeline.delivery.sink",
    "ReferenceEngine": "tickwheel.pipeline.engines.reference",
    "SparkEngine": "tickwheel.pipeline.spark",
    "deliver_outcomes": "tickwheel.pipeline.delivery.sink",
    "run_partitioned": "tickwheel.pipeline.engines.partitioned",
    "wall_clock_ms": "tickwheel.pipeline.engines.following",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'tickwheel.pipeline' has no attribute {name!r}")
    return getattr(importlib.import_module(home), name)


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
