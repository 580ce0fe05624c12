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
``CHECKPOINT/published.log`` (:class:`Publisher`): a file already published is not
published again, after a crash either, and a manifest's number is never reused.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from pathlib import Path
from typing import Any

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
    them to the log as one line (``[next number, latest mtime ms, [[number, path],
    ...]]``, fsync'd), and only then renames them into place: after a crash, a manifest
    the log names is put in place, and one it does not is removed (its file is
    published again, under a new number). The log forgets the files gone from the
    input directory once they are most of what it holds."""

    def __init__(self, input_dir: Path, checkpoint_dir: Path) -> None:
        self.input_dir = input_dir
        self.manifests = checkpoint_dir / MANIFEST_DIR
        self.log_path = checkpoint_dir / PUBLISHED_LOG
        self.manifests.mkdir(parents=True, exist_ok=True)
        self.published: dict[str, int] = {}  # input path -> its manifest's number
        self.next_number = 0
        self.latest_ms = 0
        self._recover()

    def _recover(self) -> None:
        try:
            text = self.log_path.read_bytes()
        except FileNotFoundError:
            text = b""
        whole = text.rfind(b"\n") + 1
        if whole < len(text):  # torn by a crash: its manifests were never renamed
            with open(self.log_path, "r+b") as log_file:
                log_file.truncate(whole)
        for line in text[:whole].decode("ascii").splitlines():
            next_number, latest_ms, entries = json.loads(line)
            self.next_number = max(self.next_number, next_number)
            self.latest_ms = max(self.latest_ms, latest_ms)
            for number, path in entries:
                self.published[path] = number
        numbers = set(self.published.values())
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
        new: list[tuple[int, str, Path]] = []
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
            new.append((number, text, tmp))
        if new:
            self.next_number += len(new)
            self._append([[number, text] for number, text, _ in new])
            for number, text, tmp in new:
                os.replace(tmp, self.manifests / f"{number:09d}.json")
                self.published[text] = number
        self._forget_gone(listed)
        return len(new)

    def _line(self, entries: list[list[Any]]) -> bytes:
        return (json.dumps([self.next_number, self.latest_ms, entries]) + "\n").encode("ascii")

    def _append(self, entries: list[list[Any]]) -> None:
        with open(self.log_path, "ab") as out:
            out.write(self._line(entries))
            out.flush()
            os.fsync(out.fileno())

    def _forget_gone(self, listed: list[Path]) -> None:
        """Forget the files gone from the input directory (one that comes back under
        the same name is new input) once they are most of what the log holds."""
        if len(self.published) <= 2 * len(listed) + _SLACK:
            return
        present = {str(path.absolute()) for path in listed}
        self.published = {path: n for path, n in self.published.items() if path in present}
        tmp = self.log_path.with_name(f".{self.log_path.name}.tmp")
        with open(tmp, "wb") as out:
            out.write(self._line([[n, path] for path, n in self.published.items()]))
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, self.log_path)
        log.info("published log rewritten: %d input files kept", len(self.published))


def read_manifest(content: bytes) -> tuple[str, str]:
    """The input file a manifest names, and its kind (``jsonl`` or ``parquet``)."""
    entry = json.loads(content)
    return str(entry["path"]), str(entry["kind"])
