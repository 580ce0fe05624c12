"""The range of each pipeline option, the same for both engines and every front door
(checked before anything is read or written)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Final

__all__ = ["DEFAULT_BYTES_PER_TRIGGER", "DEFAULT_DRIVER_MEMORY",
           "DEFAULT_FOLLOW_BYTES_PER_BATCH", "DEFAULT_LATENESS_MS",
           "DEFAULT_MAX_FUTURE_MS", "DEFAULT_SPILL_BYTES", "DEFAULT_SPILL_EVENTS",
           "DEFAULT_STOP_TIMEOUT_MS", "DEFAULT_TRIGGER_MS",
           "FOLLOW_DEDUPE_RETENTION_MS", "MAX_FILES_PER_TRIGGER", "MAX_LATENESS_MS",
           "MAX_PARTITIONS", "MAX_RETENTION_MS", "MAX_TRIGGER_MS",
           "OCCURRENCES_PER_BATCH", "RESERVED_SPARK_SETTINGS", "check_driver_memory",
           "check_spark_setting_names", "check_spark_settings"]

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
#: The Spark engine's micro-batch reads about this much input at most (as
#: :func:`~tickwheel.pipeline.io.log_reader.input_bytes` weighs it: a Parquet file by its rows;
#: one file at least), unless files per trigger are asked for: a stage's task holds
#: its partition's share of a micro-batch's rows and outputs. 1 GiB of the
#: generator's JSON Lines is about 8M events.
DEFAULT_BYTES_PER_TRIGGER: Final = 1 << 30
#: The local engine in follow mode reads at most this much new input per batch (one
#: file at least): one process holds a batch's rows, about 6x their bytes in memory, so
#: a backlog is worked off in batches of about 300k of the generator's events.
DEFAULT_FOLLOW_BYTES_PER_BATCH: Final = 32 << 20
#: The local batch engine sorts a log of more events than this on disk, this many at a
#: time: about 50 MB of the generator's events in memory.
DEFAULT_SPILL_EVENTS: Final = 100_000
#: ... or once the events held reach this much row text (a log of large rows).
DEFAULT_SPILL_BYTES: Final = 64 << 20
#: Follow mode: how often a batch runs when nothing falls due sooner.
DEFAULT_TRIGGER_MS: Final = 1000
MAX_TRIGGER_MS: Final = 86_400_000
#: Follow mode on the wall clock: rows further ahead of the clock than this are
#: quarantined as ``future`` (clock skew between producers stays well inside it).
DEFAULT_MAX_FUTURE_MS: Final = 300_000
#: Follow mode: how long a stop waits for a processor to settle what it was handed.
DEFAULT_STOP_TIMEOUT_MS: Final = 30_000
#: Follow mode remembers an op_id this long by default (and while it is pending), so
#: that memory follows the rate and what is pending rather than every id ever seen.
FOLLOW_DEDUPE_RETENTION_MS: Final = 60_000
#: The driver JVM's memory for a Spark session tickwheel starts itself.
DEFAULT_DRIVER_MEMORY: Final = "4g"
#: Spark refuses a driver with less than 1.5 times its 300 MiB reserve.
_MIN_DRIVER_MIB: Final = 450
_MEMORY = re.compile(r"([0-9]{1,12})([kmgt])", re.IGNORECASE)
_MIB_PER_UNIT: Final = {"k": 1 / 1024, "m": 1, "g": 1024, "t": 1024 * 1024}


def check_driver_memory(value: str) -> str:
    """``value`` if it is a JVM memory size Spark takes for ``spark.driver.memory`` (a
    whole number and a unit: ``512m``, ``2g``) and enough for Spark to start."""
    match = _MEMORY.fullmatch(value)
    if match is None:
        raise ValueError(f"driver memory must be a whole number and a unit k, m, g or t, "
                         f"as in 512m or 2g; got {value!r}")
    mib = int(match[1]) * _MIB_PER_UNIT[match[2].lower()]
    if mib < _MIN_DRIVER_MIB:
        raise ValueError(f"driver memory must be at least {_MIN_DRIVER_MIB}m for Spark to "
                         f"start; got {value!r}")
    return value


#: Spark settings a user may not give as such: the engine's own, or one that an option
#: of its own sets (the value it names).
RESERVED_SPARK_SETTINGS: Final = {
    "spark.master": "--master (or spark-submit's)",
    "spark.driver.memory": "--driver-memory (or spark-submit's)",
    "spark.sql.streaming.stateStore.providerClass":
        "nothing: the engine's state needs RocksDB's state store",
}


def check_spark_settings(items: list[str]) -> dict[str, str]:
    """``KEY=VALUE`` items, as spark-submit's ``--conf`` takes them, as a dict: each key
    a Spark setting that :func:`check_spark_setting_names` takes, given once."""
    settings: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ValueError(f"a Spark setting is KEY=VALUE, as in "
                             f"spark.executor.memory=2g; got {item!r}")
        _check_setting_name(key)
        if key in settings and settings[key] != value:
            raise ValueError(f"{key} is given twice, as {settings[key]!r} and {value!r}")
        settings[key] = value
    return settings


def check_spark_setting_names(settings: Mapping[str, str]) -> dict[str, str]:
    """``settings`` as a dict, if every key is a Spark setting (``spark.`` first; Spark
    ignores any other) that is not reserved (see :data:`RESERVED_SPARK_SETTINGS`)."""
    for key in settings:
        _check_setting_name(key)
    return dict(settings)


def _check_setting_name(key: str) -> None:
    if not key.startswith("spark.") or key == "spark.":
        raise ValueError(f"{key!r} is not a Spark setting: their names start with 'spark.'")
    if key in RESERVED_SPARK_SETTINGS:
        raise ValueError(f"{key} cannot be set here; use {RESERVED_SPARK_SETTINGS[key]}")

#: Occurrences of schedules a batch decides one by one, about (an op partition's, in a
#: follow-mode batch or a Spark micro-batch; a share of a local batch run): those it
#: fires, and those a cron's catch-up passes over. A catch-up after an outage or a gap in
#: the log takes as many batches as it needs: a batch's outcomes stay within a few
#: hundred MB, and its state is saved on time.
OCCURRENCES_PER_BATCH: Final = 262_144
