"""The range of each pipeline option, the same for both engines and every front door
(checked before anything is read or written)."""

from __future__ import annotations

from typing import Final

__all__ = ["DEFAULT_LATENESS_MS", "DEFAULT_TRIGGER_MS", "FOLLOW_DEDUPE_RETENTION_MS",
           "MAX_FILES_PER_TRIGGER", "MAX_LATENESS_MS", "MAX_PARTITIONS", "MAX_RETENTION_MS",
           "MAX_TRIGGER_MS"]

DEFAULT_LATENESS_MS: Final = 10_000
#: A long of microseconds, as Spark's intervals take it: a bound any Spark setting can
#: carry.
MAX_LATENESS_MS: Final = (2**63 - 1) // 1000
#: Retention and times are longs in the Spark engine's state.
MAX_RETENTION_MS: Final = 2**63 - 1
#: Each partition of a stage is a shuffle partition and a state store, and finding
#: their labels takes a job over 64 values per partition.
MAX_PARTITIONS: Final = 4096
#: Spark reads ``maxFilesPerTrigger`` as a Java int.
MAX_FILES_PER_TRIGGER: Final = 2**31 - 1
#: Follow mode: how often a batch runs when nothing falls due sooner.
DEFAULT_TRIGGER_MS: Final = 1000
MAX_TRIGGER_MS: Final = 86_400_000
#: Follow mode remembers an op_id this long by default (and while it is pending), so
#: that memory follows the rate and what is pending rather than every id ever seen.
FOLLOW_DEDUPE_RETENTION_MS: Final = 60_000
