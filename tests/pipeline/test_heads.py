"""A partition's head, saved as bytes and read back: the same record, and a head in
another format refused by name."""

from __future__ import annotations

import marshal

import pytest

from tickwheel.pipeline.contract.events import Wire, compact_wire
from tickwheel.pipeline.semantics.partition import KeyPartition, OpPartition
from tickwheel.pipeline.state.encoding import HEAD_FORMAT
from tickwheel.pipeline.state.heads import decode_key_head, decode_op_head, encode_head

WATCH = ('{"ts_ms": 5, "type": "watch", "op_id": "a", "keys": ["k"], "deadline_ms": 50, '
         '"condition": "any_update"}')


def _wire() -> list[Wire]:
    return [compact_wire(WATCH)]


def test_a_key_and_an_op_head_read_back_as_the_records_saved() -> None:
    keys = KeyPartition(0, 2, 10)
    keys.take(_wire(), 5)
    ops = OpPartition(1, 10)
    assert decode_key_head(encode_head(keys.head())) == keys.head()
    assert decode_op_head(encode_head(ops.head())) == ops.head()
    assert keys.head().held  # the row held is in the head


def test_the_bytes_are_the_format_number_then_the_fields() -> None:
    head = OpPartition(3, 10).head()
    assert marshal.loads(encode_head(head)) == (HEAD_FORMAT, *head)


@pytest.mark.parametrize("stage", ["key", "op"])
def test_a_head_in_another_format_is_refused_naming_the_stage_and_both_formats(
        stage: str) -> None:
    head = KeyPartition(0, 1, 0).head() if stage == "key" else OpPartition(0, 0).head()
    other = marshal.dumps((HEAD_FORMAT + 1, *head))
    decode = decode_key_head if stage == "key" else decode_op_head
    with pytest.raises(ValueError, match=f"{stage} partition head format "
                                         f"{HEAD_FORMAT + 1} is not supported .* reads "
                                         f"{HEAD_FORMAT}"):
        decode(other)
