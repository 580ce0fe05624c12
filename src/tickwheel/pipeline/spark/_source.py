"""The Spark engine's input as a Python streaming data source (PySpark's documented
``DataSource`` API): offsets are the numbers an
:class:`~tickwheel.pipeline.spark._input_log.InputLog` gives the input files.

Spark calls the reader's offset methods in one Python process beside the driver, for
the query's life, and :meth:`InputReader.read` in the executors' Python workers. A
micro-batch's offsets are ``{"next": n}``, so Spark's offset log holds two numbers per
micro-batch whatever the input has held, and its commits let the log forget. Each row
is an input file's path as bytes (``os.fsencode``), so a name with undecodable bytes
reaches the packers as it is.

With the wall clock, the offsets also hold the clock's reading, ``{"next": n,
"clock": ms}``, and every row carries it, with a row of its own in a micro-batch
without files: a micro-batch run again after a crash reads the same clock. The reading
moves at least once a second without input, and stands still in a micro-batch that
leaves listed files for later ones (the read limit; ``"backlog"`` in the offsets) and in
those that read them: the reading has passed rows that landed in time. With
a submit server's floor file, the
clock reads at most the floor plus the lateness bound, read before the listing, so a
row the server stamped is never late (see
:meth:`~tickwheel.service.server.SubmitServer.time_floor`).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxBytes,
    ReadMaxFiles,
    SupportsTriggerAvailableNow,
)

from tickwheel.pipeline.spark._input_log import InputLog

__all__ = ["INPUT_FORMAT", "InputSource", "input_options"]

#: The name the source is registered under.
INPUT_FORMAT = "tickwheel_input"
#: The source's columns: an input file's path (None in a row of the clock alone), and
#: the wall clock's reading (None without the wall clock).
INPUT_SCHEMA = "file binary, clock long"
#: Without input, the clock moves once this much time has passed: a micro-batch a
#: second when idle.
CLOCK_STEP_MS = 1000
#: The most of the floor file read: a number and a newline.
_FLOOR_BYTES = 32


def input_options(input_dir: Path, checkpoint_dir: Path, max_files: int | None,
                  partitions: int, follow: bool = False, max_bytes: int | None = None,
                  wall_clock: bool = False, floor_file: Path | None = None,
                  lateness_ms: int = 0) -> dict[str, str]:
    """The source's options. Paths go as JSON (ASCII): an option crosses the JVM as
    a Java string, where a lone surrogate (an undecodable byte) would not survive.
    ``follow``: list the input at every trigger; otherwise once, at the first, so that
    a run reads the files the directory held when it started. ``wall_clock``: the
    rows carry its readings, held within ``lateness_ms`` of ``floor_file``'s floor."""
    options = {"input": json.dumps(str(input_dir.absolute())),
               "checkpoint": json.dumps(str(checkpoint_dir.absolute())),
               "partitions": str(partitions), "follow": json.dumps(follow),
               "wallClock": json.dumps(wall_clock), "latenessMs": str(lateness_ms)}
    if floor_file is not None:
        options["floor"] = json.dumps(str(floor_file.absolute()))
    if max_files is not None:
        options["maxFilesPerTrigger"] = str(max_files)
    elif max_bytes is not None:
        options["maxBytesPerTrigger"] = str(max_bytes)
    return options


class FilesPartition(InputPartition):
    """Some of a micro-batch's files, read by one task, with the micro-batch's clock;
    no files: a row of the clock alone."""

    def __init__(self, files: list[bytes], clock: int | None = None) -> None:
        super().__init__((files, clock))
        self.files = files
        self.clock = clock


class InputReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """The offsets, from the input log; see the module."""

    def __init__(self, options: Mapping[str, str]) -> None:
        self.log = InputLog(Path(json.loads(options["input"])),
                            Path(json.loads(options["checkpoint"])))
        self.partitions_wanted = int(options["partitions"])
        limit = options.get("maxFilesPerTrigger")
        self.max_files = None if limit is None else int(limit)
        budget = options.get("maxBytesPerTrigger")
        self.max_bytes = None if budget is None else int(budget)
        self.follow = bool(json.loads(options.get("follow", "false")))
        self.wall_clock = bool(json.loads(options.get("wallClock", "false")))
        self.lateness_ms = int(options.get("latenessMs", "0"))
        floor = options.get("floor")
        self.floor_file = None if floor is None else Path(json.loads(floor))
        self.until: int | None = None  # the last offset of the run, once listed for good

    def initialOffset(self) -> dict[str, int]:  # noqa: N802 (the API's names)
        return {"next": 0, "clock": 0} if self.wall_clock else {"next": 0}

    def _clock(self, start: int) -> int:
        """The wall clock's reading, held within the lateness bound of the floor and
        never below ``start``, the last micro-batch's."""
        now = time.time_ns() // 1_000_000
        if self.floor_file is not None:
            floor = _read_floor(self.floor_file)
            if floor is None:  # not written yet: time waits for it
                return start
            now = min(now, floor + self.lateness_ms)
        return max(now, start)

    def getDefaultReadLimit(self) -> ReadLimit:  # noqa: N802
        if self.max_files is not None:
            return ReadMaxFiles(self.max_files)
        if self.max_bytes is not None:
            return ReadMaxBytes(self.max_bytes)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:  # noqa: N802
        self.log.publish()
        self.until = self.log.next_number

    def latestOffset(self, start: dict[str, int],  # noqa: N802
                     limit: ReadLimit) -> dict[str, int]:
        # Spark asks for the next offset once the micro-batch before has committed, so
        # every file below ``start`` is committed: a file deleted while no micro-batch
        # runs is forgotten at once, and one written again under its name is new input
        # (Spark's own commit call comes only with the next micro-batch).
        self.log.commit(start["next"])
        # The clock before the listing: a file listed after it landed after it too.
        # Files the last micro-batch listed and left for this one (its read limit)
        # are read at its clock, not a later one that would count their rows late.
        clock = None
        if self.wall_clock:
            clock = start["clock"] if start.get("backlog") else self._clock(start["clock"])
        if self.follow:
            self.log.publish_or_wait()
        elif self.until is None:
            self.log.publish()
            self.until = self.log.next_number
        end = self.log.next_number if self.until is None else self.until
        available = end
        if isinstance(limit, ReadMaxFiles):
            end = min(end, start["next"] + limit.max_files)
        elif isinstance(limit, ReadMaxBytes):
            end = self.log.end_within(start["next"], end, limit.max_bytes)
        end = max(end, start["next"])
        if clock is None:
            return {"next": end}
        if end == start["next"] and clock - start["clock"] < CLOCK_STEP_MS:
            return start  # nothing new: no micro-batch yet
        if end < available:  # files left for later: this micro-batch's time stands too
            return {"next": end, "clock": start["clock"] or clock, "backlog": 1}
        return {"next": end, "clock": clock}

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[FilesPartition]:
        files = [os.fsencode(path) for path in self.log.files(start["next"], end["next"])]
        clock = end.get("clock")
        if not files:
            return [] if clock is None else [FilesPartition([], clock)]
        # Contiguous runs, in file order: the packers read each file whole.
        count = min(len(files), self.partitions_wanted)
        size = -(-len(files) // count)
        return [FilesPartition(files[i:i + size], clock) for i in range(0, len(files), size)]

    def read(self, partition: InputPartition) -> Iterator[tuple[bytes | None, int | None]]:
        assert isinstance(partition, FilesPartition)
        if not partition.files:
            yield (None, partition.clock)
        for file in partition.files:
            yield (file, partition.clock)

    def commit(self, end: dict[str, int]) -> None:
        self.log.commit(end["next"])


def _read_floor(path: Path) -> int | None:
    """The floor the submit server wrote, or None if there is none to read. A few
    bytes, and never through a symlink: the file is the server's, in the checkpoint."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        text = os.read(fd, _FLOOR_BYTES + 1)
    finally:
        os.close(fd)
    if len(text) > _FLOOR_BYTES:  # not what the server writes
        return None
    try:
        return int(text)
    except ValueError:
        return None


class InputSource(DataSource):
    """The data source Spark instantiates from the options of :func:`input_options`."""

    @classmethod
    def name(cls) -> str:
        return INPUT_FORMAT

    def schema(self) -> str:
        return INPUT_SCHEMA

    def streamReader(self, schema: Any) -> InputReader:  # noqa: N802
        return InputReader(self.options)
