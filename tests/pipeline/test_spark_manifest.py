"""The Spark engine's manifests: each input file is published once, under a number that
is never used again, across restarts and crashes, and after Spark has deleted the
manifests its committed micro-batches took."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tickwheel.pipeline.spark import _manifest
from tickwheel.pipeline.spark._manifest import MANIFEST_DIR, PUBLISHED_LOG, Publisher, read_manifest


def _land(directory: Path, *names: str) -> None:
    directory.mkdir(exist_ok=True)
    for name in names:
        (directory / name).write_text('{"ts_ms":1,"type":"tick"}\n')


def _manifests(checkpoint: Path) -> dict[int, str]:
    return {int(p.stem): read_manifest(p.read_bytes())[0]
            for p in (checkpoint / MANIFEST_DIR).glob("*.json")}


def _taken_by_spark(checkpoint: Path) -> None:
    """What the file source's clean-up does once a micro-batch has committed."""
    for path in (checkpoint / MANIFEST_DIR).glob("*.json"):
        path.unlink()


def test_each_input_file_is_published_once_in_name_order(tmp_path: Path) -> None:
    inbox, checkpoint = tmp_path / "in", tmp_path / "ckpt"
    _land(inbox, "b.jsonl", "a.jsonl")
    publisher = Publisher(inbox, checkpoint)
    assert publisher.publish() == 2
    assert _manifests(checkpoint) == {0: str(inbox / "a.jsonl"), 1: str(inbox / "b.jsonl")}
    assert publisher.publish() == 0
    _land(inbox, "c.jsonl")
    assert publisher.publish() == 1
    assert _manifests(checkpoint)[2] == str(inbox / "c.jsonl")
    mtimes = [(checkpoint / MANIFEST_DIR / f"{n:09d}.json").stat().st_mtime_ns
              for n in range(3)]
    assert mtimes == sorted(set(mtimes))  # Spark's file source takes them in this order


def test_a_restart_publishes_nothing_again_after_spark_deleted_the_manifests(
        tmp_path: Path) -> None:
    inbox, checkpoint = tmp_path / "in", tmp_path / "ckpt"
    _land(inbox, "a.jsonl", "b.jsonl")
    Publisher(inbox, checkpoint).publish()
    _taken_by_spark(checkpoint)
    _land(inbox, "c.jsonl")
    restarted = Publisher(inbox, checkpoint)
    assert restarted.publish() == 1
    # A number Spark has seen is never used again: its file source would skip it.
    assert _manifests(checkpoint) == {2: str(inbox / "c.jsonl")}


def test_a_restart_before_spark_took_the_manifests_publishes_nothing_again(
        tmp_path: Path) -> None:
    inbox, checkpoint = tmp_path / "in", tmp_path / "ckpt"
    _land(inbox, "a.jsonl")
    Publisher(inbox, checkpoint).publish()
    _land(inbox, "b.jsonl")
    restarted = Publisher(inbox, checkpoint)
    assert restarted.publish() == 1
    assert _manifests(checkpoint) == {0: str(inbox / "a.jsonl"), 1: str(inbox / "b.jsonl")}


def test_a_crash_before_the_log_line_publishes_the_file_again_under_a_new_number(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    inbox, checkpoint = tmp_path / "in", tmp_path / "ckpt"
    _land(inbox, "a.jsonl")
    publisher = Publisher(inbox, checkpoint)

    def crash(batch_id: int, records: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(publisher._log, "append", crash)
    with pytest.raises(KeyboardInterrupt):
        publisher.publish()
    assert [p.name for p in (checkpoint / MANIFEST_DIR).iterdir()] == [".000000000.json.tmp"]
    restarted = Publisher(inbox, checkpoint)
    assert list((checkpoint / MANIFEST_DIR).iterdir()) == []  # removed, never listed
    assert restarted.publish() == 1
    assert _manifests(checkpoint) == {0: str(inbox / "a.jsonl")}


def test_a_crash_after_the_log_line_puts_its_manifests_in_place(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    inbox, checkpoint = tmp_path / "in", tmp_path / "ckpt"
    _land(inbox, "a.jsonl", "b.jsonl")
    publisher = Publisher(inbox, checkpoint)
    real_replace = os.replace
    calls = []

    def crash_on_second(src: object, dst: object) -> None:
        calls.append(dst)
        if len(calls) == 2:
            raise KeyboardInterrupt
        real_replace(src, dst)  # type: ignore[arg-type]

    monkeypatch.setattr(_manifest.os, "replace", crash_on_second)
    with pytest.raises(KeyboardInterrupt):
        publisher.publish()
    monkeypatch.setattr(_manifest.os, "replace", real_replace)
    restarted = Publisher(inbox, checkpoint)
    assert _manifests(checkpoint) == {0: str(inbox / "a.jsonl"), 1: str(inbox / "b.jsonl")}
    assert restarted.publish() == 0


def test_a_log_line_torn_by_a_crash_is_cut_off(tmp_path: Path) -> None:
    inbox, checkpoint = tmp_path / "in", tmp_path / "ckpt"
    _land(inbox, "a.jsonl")
    Publisher(inbox, checkpoint).publish()
    with open(checkpoint / PUBLISHED_LOG, "ab") as out:
        out.write(b'[5, [[4, "/x')
    _land(inbox, "b.jsonl")
    restarted = Publisher(inbox, checkpoint)
    assert restarted.publish() == 1
    lines = (checkpoint / PUBLISHED_LOG).read_text().splitlines()
    assert [[record[:2] for record in json.loads(line)[1]] for line in lines] == [
        [[0, str(inbox / "a.jsonl")]], [[1, str(inbox / "b.jsonl")]]]


def test_files_gone_from_the_input_are_forgotten_once_they_are_most_of_the_log(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_manifest, "_SLACK", 2)
    inbox, checkpoint = tmp_path / "in", tmp_path / "ckpt"
    inbox.mkdir()
    publisher = Publisher(inbox, checkpoint)
    for n in range(10):
        _land(inbox, f"{n:02d}.jsonl")
        publisher.publish()
        if n < 9:
            (inbox / f"{n:02d}.jsonl").unlink()  # the user's retention
    assert len(publisher.published) <= 2 * 1 + 2
    lines = (checkpoint / PUBLISHED_LOG).read_text().splitlines()
    assert len(lines) < 10
    restarted = Publisher(inbox, checkpoint)
    assert restarted.publish() == 0
    assert restarted.next_number == 10
    _land(inbox, "00.jsonl")  # back under an old name: new input
    assert restarted.publish() == 1
    assert _manifests(checkpoint)[10] == str(inbox / "00.jsonl")


def test_odd_file_names_survive_the_log(tmp_path: Path) -> None:
    # Undecodable bytes in a directory's name come as lone surrogates.
    inbox, checkpoint = tmp_path / "in \udcff[x]", tmp_path / "ckpt"
    _land(inbox, "é[1]{a,b}*?.jsonl")
    Publisher(inbox, checkpoint).publish()
    _taken_by_spark(checkpoint)
    assert Publisher(inbox, checkpoint).publish() == 0
