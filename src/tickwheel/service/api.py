"""The submit API's words, shared by the server and its clients: header names, the
statuses a client retries, and a refused row as an answer names it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

__all__ = ["IDEMPOTENCY_KEY", "REPLAYED", "RETRIED_STATUSES", "RETRY_AFTER", "RefusedRow"]

#: The request header that makes a retry safe: a key answered before is answered again.
IDEMPOTENCY_KEY: Final = "Idempotency-Key"
#: The answer header that says so: ``true`` when the answer is a replay.
REPLAYED: Final = "Idempotent-Replayed"
#: The answer header of a 503 (and a 429): seconds before a retry.
RETRY_AFTER: Final = "Retry-After"
#: Congestion and server faults: a client retries them under the same key.
RETRIED_STATUSES: Final = frozenset({429, 500, 502, 503, 504})


@dataclass(frozen=True, slots=True)
class RefusedRow:
    """One row of a request that no engine would apply, and why (a quarantine reason,
    as the engines name it); ``index`` counts the request's rows from 0."""

    index: int
    reason: str
    row: str
