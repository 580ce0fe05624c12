"""The output contract: one resolved operation or fired occurrence, as the engines write
it to ``outcomes/`` and hand it to a processor or a webhook."""

from __future__ import annotations

from typing import NamedTuple

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
