"""How checkpoints encode what they hold, and every format number they carry.

Chunks of records (a partition's entries, its seen op ids, its head) are ``marshal``'d
at version 4, pinned: the bytes do not follow a newer Python's default, and every
CPython from 3.4 on reads them. What they hold is plain: ints, strs, bytes, tuples,
lists, dicts and None. Each log of chunks carries a chained digest (BLAKE2b, keyed with
the digest before), so that a copy of the log can tell whether a stored log still
begins with the chunks the copy holds.

A checkpoint, a state or a head in a format other than the one named here is refused
by name, with both numbers. This is the one policy for everything tickwheel keeps on
disk (the submit server's key log too): nothing is migrated; a format that changes gets
a new number, and data in an older one is refused, naming it.
"""

from __future__ import annotations

import hashlib
import marshal
from typing import Any, Final

__all__ = [
    "HEAD_FORMAT",
    "LOCAL_CHECKPOINT_FORMAT",
    "LOCAL_STATE_FORMAT",
    "MARSHAL_VERSION",
    "SPARK_CHECKPOINT_FORMAT",
    "chain_digest",
    "decode",
    "encode",
]

#: The ``marshal`` format every chunk is written in.
MARSHAL_VERSION: Final = 4
#: The local engine's follow-mode checkpoint (its ``tickwheel.json``).
LOCAL_CHECKPOINT_FORMAT: Final = 7
#: The local engine's state file: the batch committed, both heads, and what it relies on.
LOCAL_STATE_FORMAT: Final = 5
#: The Spark engine's checkpoint: its layout, its sources (the wall clock is in the input
#: source's offsets) and its state store's values.
SPARK_CHECKPOINT_FORMAT: Final = 11
#: Both stages' partition heads, in either engine.
HEAD_FORMAT: Final = 2


def encode(value: Any) -> bytes:
    """``value`` (plain types only) as the bytes a checkpoint holds."""
    return marshal.dumps(value, MARSHAL_VERSION)


def decode(data: bytes) -> Any:
    """What :func:`encode` made ``data`` from; ValueError, EOFError or TypeError for
    bytes it did not make."""
    return marshal.loads(data)


def chain_digest(digest: bytes, chunk: bytes) -> bytes:
    """The digest of the log whose digest is ``digest``, extended by ``chunk``."""
    return hashlib.blake2b(chunk, digest_size=16, key=digest).digest()
