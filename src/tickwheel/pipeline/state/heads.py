"""A partition's head as bytes: :class:`~tickwheel.pipeline.semantics.partition.KeyHead`
and :class:`~tickwheel.pipeline.semantics.partition.OpHead`, each behind its format
number (:data:`~tickwheel.pipeline.state.encoding.HEAD_FORMAT`), in the checkpoints'
encoding (:mod:`~tickwheel.pipeline.state.encoding`).

A head in another format is refused by name: the stage and both formats.
"""

from __future__ import annotations

from tickwheel.pipeline.semantics.partition import KeyHead, OpHead
from tickwheel.pipeline.state.encoding import HEAD_FORMAT, decode, encode

__all__ = ["decode_key_head", "decode_op_head", "encode_head"]


def encode_head(head: KeyHead | OpHead) -> bytes:
    return encode((HEAD_FORMAT, *head))


def _fields(data: bytes, stage: str) -> tuple[object, ...]:
    fields = decode(data)
    if not isinstance(fields, tuple) or not fields or fields[0] != HEAD_FORMAT:
        found = fields[0] if isinstance(fields, tuple) and fields else fields
        raise ValueError(f"{stage} partition head format {found!r} is not supported "
                         f"(this version of tickwheel reads {HEAD_FORMAT})")
    return fields[1:]


def decode_key_head(data: bytes) -> KeyHead:
    return KeyHead._make(_fields(data, "key"))


def decode_op_head(data: bytes) -> OpHead:
    return OpHead._make(_fields(data, "op"))
