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
a dot), so a source never lists half of one; a file already published is not
published again, so a run after a crash publishes only what is missing. Spark's
source log records which manifests a micro-batch has taken, as it recorded the input
files before.
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

from tickwheel.pipeline.io import input_files

__all__ = ["MANIFEST_DIR", "publish", "read_manifest"]

MANIFEST_DIR = "manifest"
_NAME = re.compile(r"(\d{9})\.json")


def _published(manifests: Path) -> tuple[set[str], int, int]:
    """The input paths published under ``manifests``, the next manifest's number, and
    the latest manifest's modification time (ms)."""
    paths: set[str] = set()
    last = -1
    latest_ms = 0
    for entry in manifests.iterdir():
        match = _NAME.fullmatch(entry.name)
        if match is None:
            continue
        last = max(last, int(match.group(1)))
        latest_ms = max(latest_ms, entry.stat().st_mtime_ns // 1_000_000)
        paths.add(read_manifest(entry.read_bytes())[0])
    return paths, last + 1, latest_ms


def publish(input_dir: Path, checkpoint_dir: Path) -> int:
    """Publish every input file of ``input_dir`` not yet published for
    ``checkpoint_dir``, in name order; returns how many were new."""
    manifests = checkpoint_dir / MANIFEST_DIR
    manifests.mkdir(parents=True, exist_ok=True)
    done, number, latest_ms = _published(manifests)
    new = 0
    for path in input_files(input_dir):
        text = str(path.absolute())
        if text in done:
            continue
        kind = "parquet" if path.suffix == ".parquet" else "jsonl"
        target = manifests / f"{number:09d}.json"
        tmp = manifests / f".{target.name}.tmp"
        # ensure_ascii: a path's undecodable bytes (lone surrogates) survive the trip.
        tmp.write_text(json.dumps({"path": text, "kind": kind}), encoding="ascii")
        # Spark's file source takes files in order of modification time (ms), and a
        # micro-batch limited to some files must take them in name order, as the
        # reference engine reads them: each manifest is 1 ms younger than the last.
        latest_ms = max(time.time_ns() // 1_000_000, latest_ms + 1)
        os.utime(tmp, ns=(latest_ms * 1_000_000, latest_ms * 1_000_000))
        os.replace(tmp, target)
        done.add(text)
        number += 1
        new += 1
    return new


def read_manifest(content: bytes) -> tuple[str, str]:
    """The input file a manifest names, and its kind (``jsonl`` or ``parquet``)."""
    entry = json.loads(content)
    return str(entry["path"]), str(entry["kind"])
