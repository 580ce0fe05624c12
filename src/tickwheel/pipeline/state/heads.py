"""A partition's head as bytes: :class:`~tickwheel.pipeline.semantics.partition.KeyHead`
and :class:`~tickwheel.pipeline.semantics.partition.OpHead`, each behind its format
number, in ``marshal`` (the types it holds are plain: ints, strs, bytes, lists, dicts,
tuples).

A head in another format is refused by name: the stage and both formats.
"""

from __future__ import annotations

import marshal
from typing import Final

from tickwheel.pipeline.semantics.partition import KeyHead, OpHead

__all__ = ["HEAD_FORMAT", "decode_key_head", "decode_op_head", "encode_head"]

#: The format of both stages' heads.
HEAD_FORMAT: Final = 1


def encode_head(head: KeyHead | OpHead) -> bytes:
    return marshal.dumps((HEAD_FORMAT, *head))


def _fields(data: bytes, stage: str) -> tuple[object, ...]:
    fields = marshal.loads(data)
    if not isinstance(fields, tuple) or not fields or fields[0] != HEAD_FORMAT:
        found = fields[0] if isinstance(fields, tuple) and fields else fields
        raise ValueError(f"{stage} partition head format {found!r} is not supported "
                         f"(this version of tickwheel reads {HEAD_FORMAT})")
    return fields[1:]


def decode_key_head(data: bytes) -> KeyHead:
    return KeyHead._make(_fields(data, "key"))


def decode_op_head(data: bytes) -> OpHead:
    return OpHead._make(_fields(data, "op"))
