"""The output contract: one resolved operation or fired occurrence, as the engines write
it to ``outcomes/`` and hand it to a processor or a webhook."""

from __future__ import annotations

import json
from typing import Any, NamedTuple

from tickwheel.pipeline.contract.events import OutcomeKind

__all__ = ["OutcomeKind", "OutcomeRow"]


class OutcomeRow(NamedTuple):
    """One resolved operation, or one occurrence of a schedule that fired (``op_id``
    ``<schedule_id>@<occurrence ms>``). A tuple, like the log's rows: the compiled
    resolver builds millions of them on its hot path."""

    op_id: str
    outcome: OutcomeKind
    resolved_ms: int
    latency_ms: int
    keys: tuple[str, ...]
    error: str | None
    #: A ``fired`` row's: the occurrences of its schedule skipped since the last fire.
    skipped: int = 0
    #: Where the outcome is delivered: the watch's or schedule's ``target`` (None:
    #: the default target).
    target: str | None = None
    #: The watch's or schedule's ``payload``, as compact JSON text (None: it had
    #: none); :meth:`payload_value` decodes it.
    payload: str | None = None

    def payload_value(self) -> Any:
        """The payload as a JSON value (None when the row had none)."""
        return None if self.payload is None else json.loads(self.payload)
