"""The local engine's checkpoint as a store: what a commit writes, a restart reads back
the same; the plan of the next batch is given back once; what is not its own is refused
by name."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tickwheel.pipeline.semantics.partition import KeyPartition, OpPartition
from tickwheel.pipeline.state.local_checkpoint import (
    BatchPlan,
    CheckpointSettings,
    LocalCheckpoint,
)

SETTINGS = CheckpointSettings(lateness_ms=100, dedupe_retention_ms=None, clock="event")
WATCH = ('{"ts_ms": 5, "type": "watch", "op_id": "a", "keys": ["k"], "deadline_ms": 50, '
         '"condition": "any_update"}')


def _checkpoint(tmp_path: Path, settings: CheckpointSettings = SETTINGS) -> LocalCheckpoint:
    (tmp_path / "in").mkdir(exist_ok=True)
    return LocalCheckpoint(tmp_path / "ckpt", tmp_path / "in", settings)


def _partitions() -> tuple[KeyPartition, OpPartition]:
    from tickwheel.pipeline.contract.events import compact_wire

    keys, ops = KeyPartition(0, 1, 100), OpPartition(0, 100)
    for part in (keys, ops):
        part.track_changes()
    ops.stage.track_seen_changes()
    ops.take([compact_wire(WATCH)], [])
    ops.release(10)
    return keys, ops


def test_a_new_checkpoint_restores_nothing_and_names_what_it_is_made_with(
        tmp_path: Path) -> None:
    checkpoint = _checkpoint(tmp_path)
    assert checkpoint.restore() is None and checkpoint.batch_id == -1
    made = json.loads((tmp_path / "ckpt" / "tickwheel.json").read_text())
    assert made["engine"] == "local" and made["lateness_ms"] == 100
    assert made["clock"] == "event"


def test_what_a_commit_writes_a_restart_reads_back(tmp_path: Path) -> None:
    checkpoint = _checkpoint(tmp_path)
    keys, ops = _partitions()
    checkpoint.commit(0, ["a.jsonl"], keys, ops)
    assert checkpoint.files_read == {"a.jsonl"} and checkpoint.state_bytes > 0
    again = _checkpoint(tmp_path)
    restored = again.restore()
    assert restored is not None and restored.batch_id == 0 == again.batch_id
    assert restored.ops.stage.pending.keys() == ops.stage.pending.keys() == {"a"}
    assert restored.ops.head() == ops.head() and restored.keys.head() == keys.head()
    assert again.files_read == {"a.jsonl"} and again.state_bytes == checkpoint.state_bytes


def test_the_plan_of_the_next_batch_is_given_back_and_no_other(tmp_path: Path) -> None:
    checkpoint = _checkpoint(tmp_path)
    checkpoint.plan(BatchPlan(0, ["a.jsonl", "b.jsonl"], 1_234))
    assert checkpoint.planned(0) == BatchPlan(0, ["a.jsonl", "b.jsonl"], 1_234)
    assert checkpoint.planned(1) is None  # a plan of a batch that committed since


@pytest.mark.parametrize(("plan", "why"), [
    ({"batch": 0, "files": ["../secret.jsonl"], "clock_ms": None}, "not the name of a file"),
    ({"batch": 0, "files": [], "clock_ms": "noon"}, "holds a clock reading 'noon'"),
])
def test_a_plan_that_tickwheel_did_not_write_is_refused(tmp_path: Path, plan: object,
                                                         why: str) -> None:
    checkpoint = _checkpoint(tmp_path)
    checkpoint.plan_path.write_text(json.dumps(plan))
    with pytest.raises(ValueError, match=why):
        checkpoint.planned(0)


def test_other_settings_than_the_checkpoint_was_made_with_are_refused_by_name(
        tmp_path: Path) -> None:
    _checkpoint(tmp_path)
    with pytest.raises(ValueError, match=r"lateness_ms=200 but .* made with lateness_ms=100"):
        _checkpoint(tmp_path, SETTINGS._replace(lateness_ms=200))


def test_a_state_of_another_format_is_refused_naming_both(tmp_path: Path) -> None:
    from tickwheel.pipeline.state.encoding import LOCAL_STATE_FORMAT, encode

    checkpoint = _checkpoint(tmp_path)
    checkpoint.state_path.write_bytes(encode((LOCAL_STATE_FORMAT + 1, 0, b"", b"", None)))
    with pytest.raises(ValueError, match=f"state version {LOCAL_STATE_FORMAT + 1} .* reads "
                                         f"{LOCAL_STATE_FORMAT}"):
        checkpoint.restore()


def test_names_of_files_gone_from_the_input_are_forgotten(tmp_path: Path) -> None:
    checkpoint = _checkpoint(tmp_path)
    keys, ops = _partitions()
    checkpoint.commit(0, ["a.jsonl", "b.jsonl"], keys, ops)
    checkpoint.forget_files_gone({"b.jsonl", "c.jsonl"})
    assert checkpoint.files_read == {"b.jsonl"}
