"""The input files handed to Spark: one manifest file per input file, under
``CHECKPOINT/manifest/``, which the Spark engine's file source lists instead of the
input directory.

Hadoop takes ``{}[]*?\\`` in a path as a glob pattern, both where a source lists its
directory and again where each listed file is read, so an input directory or file
whose name holds one is read wrongly (nothing, or other files several times over).
Listing the input here, with :func:`~tickwheel.pipeline.io.input_files` as the local
engine does, gives both engines the same files; the manifests' own names and
directory are tickwheel's, and never a pattern.

A manifest is written whole and renamed into place (Spark skips names that start with
a dot), so a source never lists half of one. The file source deletes a manifest once
the micro-batch that took it has committed (its ``cleanSource`` option), so a service
that gets a file a second does not keep a manifest per second, and Spark lists only
the manifests not yet taken. What was published is remembered in memory and in
``CHECKPOINT/published.log`` (:class:`Publisher`, a
:class:`~tickwheel.pipeline.batch_log.BatchLog`): a file already published is not
published again, after a crash either, and a manifest's number is never reused.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from pathlib import Path

from tickwheel.pipeline.batch_log import BatchLog
from tickwheel.pipeline.io import input_files

__all__ = ["MANIFEST_DIR", "PUBLISHED_LOG", "Publisher", "read_manifest"]

log = logging.getLogger(__name__)

MANIFEST_DIR = "manifest"
PUBLISHED_LOG = "published.log"
_NAME = re.compile(r"(\d{9,})\.json")
_PENDING = re.compile(r"\.(\d{9,})\.json\.tmp")
#: Entries the log may hold beyond twice those it must keep before it is rewritten.
_SLACK = 1024


class Publisher:
    """Publishes the input files of ``input_dir`` for one checkpoint, each once.

    A call of :meth:`publish` writes its new manifests under dotted names, appends
    them to the log as one batch (its id is the next manifest number, each record
    ``[number, path, mtime ms]``), and only then renames them into place: after a
    crash, a manifest the log names is put in place, and one it does not is removed
    (its file is published again, under a new number). The log forgets the files gone
    from the input directory once they are most of what it holds."""

    def __init__(self, input_dir: Path, checkpoint_dir: Path) -> None:
        self.input_dir = input_dir
        self.manifests = checkpoint_dir / MANIFEST_DIR
        self.manifests.mkdir(parents=True, exist_ok=True)
        self._log = BatchLog(checkpoint_dir / PUBLISHED_LOG)
        # input path -> its manifest's number and modification time (ms)
        self.published: dict[str, tuple[int, int]] = {}
        self.next_number = 0
        self.latest_ms = 0
        self._recover()

    def _recover(self) -> None:
        for number, path, mtime_ms in self._log.read():
            self.published[path] = (number, mtime_ms)
            self.latest_ms = max(self.latest_ms, mtime_ms)
        self.next_number = max(self._log.last_batch, 0)
        numbers = {number for number, _ in self.published.values()}
        for entry in self.manifests.iterdir():
            pending = _PENDING.fullmatch(entry.name)
            if pending is not None:
                if int(pending.group(1)) in numbers:
                    os.replace(entry, self.manifests / entry.name[1:-len(".tmp")])
                else:
                    entry.unlink()
            elif (match := _NAME.fullmatch(entry.name)) is not None:
                # Not yet taken by a committed micro-batch; its number is used.
                self.next_number = max(self.next_number, int(match.group(1)) + 1)

    def publish(self) -> int:
        """Publish every input file not yet published, in name order; returns how many
        were new."""
        listed = input_files(self.input_dir)
        new: list[tuple[int, str, int, Path]] = []
        for path in listed:
            text = str(path.absolute())
            if text in self.published:
                continue
            number = self.next_number + len(new)
            kind = "parquet" if path.suffix == ".parquet" else "jsonl"
            tmp = self.manifests / f".{number:09d}.json.tmp"
            # ensure_ascii: a path's undecodable bytes (lone surrogates) survive the trip.
            tmp.write_text(json.dumps({"path": text, "kind": kind}), encoding="ascii")
            # Spark's file source takes files in order of modification time (ms), and a
            # micro-batch limited to some files must take them in name order, as the
            # reference engine reads them: each manifest is 1 ms younger than the last.
            self.latest_ms = max(time.time_ns() // 1_000_000, self.latest_ms + 1)
            os.utime(tmp, ns=(self.latest_ms * 1_000_000, self.latest_ms * 1_000_000))
            new.append((number, text, self.latest_ms, tmp))
        if new:
            self.next_number += len(new)
            self._log.append(self.next_number,
                             [[number, text, ms] for number, text, ms, _ in new])
            for number, text, ms, tmp in new:
                os.replace(tmp, self.manifests / f"{number:09d}.json")
                self.published[text] = (number, ms)
        self._forget_gone(listed)
        return len(new)

    def _forget_gone(self, listed: list[Path]) -> None:
        """Forget the files gone from the input directory (one that comes back under
        the same name is new input) once they are most of what the log holds."""
        if self._log.records <= 2 * len(listed) + _SLACK:
            return
        present = {str(path.absolute()) for path in listed}
        self.published = {path: entry for path, entry in self.published.items()
                          if path in present}
        self._log.rewrite(self.next_number, [[number, path, ms] for path, (number, ms)
                                             in self.published.items()])
        log.info("published log rewritten: %d input files kept", len(self.published))


def read_manifest(content: bytes) -> tuple[str, str]:
    """The input file a manifest names, and its kind (``jsonl`` or ``parquet``)."""
    entry = json.loads(content)
    return str(entry["path"]), str(entry["kind"])
