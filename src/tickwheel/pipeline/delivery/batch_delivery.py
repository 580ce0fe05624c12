"""Micro-batch outcomes to an :class:`~tickwheel.pipeline.delivery.sink.OutcomeSink`, off the
engine's thread, at least once, and never holding the engine back.

A thread of its own delivers batch N while the engine computes batch N+1. Up to
``max_behind`` batches wait for it in memory; when more come (a receiver that hangs,
answers 500 or is down for hours), later batches are not queued but read back from
their outcome files once delivery reaches them, so the engine goes on resolving and
writing its outputs, and memory stays bounded whatever the receiver does. Batches are
delivered in batch order either way.

A batch commits before its outcomes are settled, so delivery keeps its own mark: the
last batch whose outcomes the processor has settled. A run starts by delivering the
outcome files of every later batch, so a crash or a stop repeats deliveries and never
skips one. Outcome files are named by batch id (``batch-<id>``, or
``batch-<id>-<partition>`` for the Spark engine's executors, a file per partition: all
of a batch's files are delivered before its mark).

Outcomes that name targets go through :class:`Deliveries`: a :class:`BatchDelivery` per
target, each with a thread and a mark of its own and taking only its target's outcomes,
so that a target that hangs or fails holds up its own outcomes and no other's.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Final

from tickwheel.pipeline.delivery.sink import OutcomeSink
from tickwheel.pipeline.io._arrow import open_parquet
from tickwheel.pipeline.io.compaction import covered_batches
from tickwheel.pipeline.io.files import read_bytes_nofollow, write_bytes_atomically
from tickwheel.pipeline.io.outputs import outcome_rows

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["DEFAULT_ROUTE", "OTHER_TARGETS", "BatchDelivery", "Deliveries", "DeliveryLag",
           "deliveries", "mark_path"]

log = logging.getLogger(__name__)

#: The route of outcomes that name no target.
DEFAULT_ROUTE: Final = "default"
#: The route of outcomes naming a target that no other route has (without one, they
#: are not delivered: their outcome files keep them).
OTHER_TARGETS: Final = "*"


def mark_path(checkpoint_dir: Path, route: str) -> Path:
    """Where a route's mark is kept: ``delivered`` for the default route (a checkpoint
    delivered to one sink keeps its mark there), ``delivered@<target>`` for the others
    (``@`` is in no target's name)."""
    return checkpoint_dir / ("delivered" if route == DEFAULT_ROUTE else f"delivered@{route}")


@dataclass(frozen=True, slots=True)
class DeliveryLag:
    """How far delivery stands behind the engine."""

    #: Batches with outcomes handed over and not yet settled.
    batches: int
    #: The age in wall milliseconds of the oldest of them (0 when there is none).
    lag_ms: int
    #: Whether later batches are read back from their files (more than ``max_behind``
    #: waited for delivery at some point, and it has not caught up since).
    from_files: bool


def _wall_ms() -> int:
    return time.time_ns() // 1_000_000


class BatchDelivery:
    """Delivers micro-batches' outcomes to ``sink`` on a thread of its own and records
    the last batch settled in ``mark`` (a file holding a batch id)."""

    def __init__(self, sink: OutcomeSink, outcomes_dir: Path, mark: Path,
                 max_behind: int = 2, *, route: _Route | None = None) -> None:
        if max_behind < 1:
            raise ValueError(f"max_behind must be at least 1, not {max_behind}")
        self.sink = sink
        self._route = route
        self.outcomes_dir = outcomes_dir
        self.mark = mark
        self.max_behind = max_behind
        self.delivered_batches = 0
        self.caught_up_batches = 0  # batches delivered from their files at the start
        self.read_back_batches = 0  # batches delivered from their files, past max_behind
        # Once a batch's outcomes met a processor that raised, the mark stays where it
        # is for the rest of the run: the next start delivers from that batch on.
        self.held_back_from: int | None = None
        self._abandoned = False
        self._changed = threading.Condition()
        # Batches waiting in memory: (batch id, outcomes, wall ms handed over).
        self._queued: deque[tuple[int, pa.Table | list[Path], int]] = deque()
        # While set, every batch up to this id is read back from its files, so that
        # batches stay in order behind those that came before.
        self._behind_upto: int | None = None
        self._behind_since: int | None = None  # wall ms at which the first of them came
        self._current_since: int | None = None  # of the batch being delivered
        self._handed = self._settled = 0  # batches handed over by submit, and settled
        self._behind_count = 0  # batches handed over to be read back, not yet taken
        self._closing = False
        self._failure: BaseException | None = None
        if not mark.exists():
            # From now on a sink is used: no batch after the mark merges until it is
            # settled, however long the first delivery takes.
            write_bytes_atomically(b"-1", mark)
        # What the last run left unsettled, listed before this run writes a batch.
        self._last_delivered = self.last_settled()
        self._left_over = self._files_after(self._last_delivered)
        name = "tickwheel-delivery" if route is None else f"tickwheel-delivery-{route.name}"
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def last_settled(self) -> int:
        """The mark: the last batch whose outcomes were settled (-1 for none)."""
        try:
            return int(read_bytes_nofollow(self.mark))
        except FileNotFoundError:
            return -1

    def submit(self, batch_id: int, outcomes: pa.Table | list[Path]) -> None:
        """Hand over a batch's outcomes, or its outcome files, after its files are
        written; never waits for delivery (past ``max_behind`` batches in memory, the
        batch is read back from its files later). Raises what stopped the thread."""
        self._raise_failure()
        with self._changed:
            self._handed += 1
            if self._behind_upto is not None or len(self._queued) >= self.max_behind:
                if self._behind_upto is None:
                    log.warning("delivery is %d batches behind: batch %d and later ones "
                                "are delivered from their files when it catches up",
                                len(self._queued), batch_id)
                    self._behind_since = _wall_ms()
                elif self._behind_since is None:
                    self._behind_since = _wall_ms()
                self._behind_upto = batch_id
                self._behind_count += 1
            else:
                self._queued.append((batch_id, outcomes, _wall_ms()))
            self._changed.notify()

    def lag(self) -> DeliveryLag:
        """How far delivery stands behind: safe to read from any thread."""
        with self._changed:
            since = [t for t in (self._current_since, self._behind_since) if t is not None]
            if self._queued:
                since.append(self._queued[0][2])
            oldest = min(since, default=None)
            return DeliveryLag(self._handed - self._settled,
                               0 if oldest is None else max(0, _wall_ms() - oldest),
                               self._behind_upto is not None)

    def begin_close(self) -> None:
        """Deliver what is handed over, then stop (:meth:`close` waits for it)."""
        with self._changed:
            self._closing = True
            self._changed.notify()

    def close(self, *, raise_failure: bool = True, timeout_s: float | None = None) -> int:
        """Wait until every batch handed over is settled, or ``timeout_s`` (then stop
        waiting for the processor: what it has not settled stays for the next start);
        raise what stopped the thread (unless the caller is already failing for another
        reason). Returns how many outcomes are left undelivered."""
        self.begin_close()
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            log.warning("delivery did not finish within %.0f s: stopping without it",
                        timeout_s)
            self._abandoned = True  # what the cancel makes the thread raise is ours
            self.sink.cancel()
            self._thread.join(5)
        if raise_failure:
            self._raise_failure()
        return self.undelivered()

    def undelivered(self) -> int:
        """Outcomes in the files of batches after the mark: the next start delivers
        them."""
        rows = 0
        for paths in self._files_after(self.last_settled()).values():
            for path in paths:
                if self._route is not None:
                    rows += self._route.select(_read(path)).num_rows
                    continue
                with open_parquet(path) as file:
                    rows += file.metadata.num_rows
        return rows

    def _raise_failure(self) -> None:
        if self._failure is not None and not self._abandoned:
            raise RuntimeError("delivering outcomes to the sink failed") from self._failure

    def _run(self) -> None:
        try:
            self._catch_up()
            while self._next():
                pass
        except BaseException as exc:  # raised in the engine's thread by submit/close
            log.exception("outcome delivery failed")
            self._failure = exc

    def _next(self) -> bool:
        """Deliver what comes next: a batch in memory, else the batches to read back
        from their files; False once closing with nothing left."""
        item: tuple[int, pa.Table | list[Path], int] | None = None
        with self._changed:
            while not self._queued and self._behind_upto is None and not self._closing:
                self._changed.wait()
            if self._queued:
                item = self._queued.popleft()
                self._current_since = item[2]
            elif self._behind_upto is not None:
                upto = self._behind_upto
                # Some of them wrote no outcome file: all count as settled once the
                # files up to ``upto`` are.
                taken, self._behind_count = self._behind_count, 0
                # From here the batch being read back stands for the oldest.
                self._current_since, self._behind_since = self._behind_since, None
            else:
                return False
        if item is not None:
            self._deliver(item[0], item[1])
            self._settled_one()
            return True
        for batch_id, paths in self._files_after(self._last_delivered, upto).items():
            with self._changed:
                self._current_since = _mtime_ms(paths)
            self._deliver(batch_id, paths)
            self.read_back_batches += 1
            self.delivered_batches += 1
        with self._changed:
            self._settled += taken
            self._current_since = None
            if self._behind_upto == upto:  # caught up: later batches wait in memory
                self._behind_upto = None
                log.info("delivery caught up with batch %d", upto)
        return True

    def _settled_one(self) -> None:
        self.delivered_batches += 1
        with self._changed:
            self._settled += 1
            self._current_since = None

    def _files_after(self, after: int, upto: int | None = None) -> dict[int, list[Path]]:
        """The outcome files of each batch after ``after`` (up to ``upto``), in batch
        order: single-batch files only (compaction merges settled batches alone)."""
        later: dict[int, list[Path]] = {}
        for path in sorted(self.outcomes_dir.glob("batch-*.parquet")):
            span = covered_batches(path)
            if (span is not None and span[0] == span[1] > after
                    and (upto is None or span[0] <= upto)):
                later.setdefault(span[0], []).append(path)
        return dict(sorted(later.items()))

    def _catch_up(self) -> None:
        for batch_id, paths in self._left_over.items():
            log.info("delivering batch %d again from %s: its outcomes were not settled "
                     "before the last run stopped", batch_id, ", ".join(p.name for p in paths))
            self._deliver(batch_id, paths)
            self.caught_up_batches += 1

    def _deliver(self, batch_id: int, outcomes: pa.Table | list[Path]) -> None:
        failed = self.sink.failed
        for table in ([_read(path) for path in outcomes]
                      if isinstance(outcomes, list) else [outcomes]):
            chosen = table if self._route is None else self._route.select(table)
            if chosen.num_rows:
                self.sink.deliver(outcome_rows(chosen))
        if not self.sink.flush():
            raise RuntimeError(f"the sink closed before batch {batch_id} was settled")
        self._last_delivered = max(self._last_delivered, batch_id)
        if self.sink.failed > failed and self.held_back_from is None:
            log.warning("the processor raised on outcomes of batch %d: they, and those of "
                        "every later batch, are delivered again at the next start",
                        batch_id)
            self.held_back_from = batch_id
        if self.held_back_from is None and batch_id > self.last_settled():
            write_bytes_atomically(str(batch_id).encode(), self.mark)


class _Route:
    """Which outcomes one route takes, by their ``target``."""

    __slots__ = ("name", "others")

    def __init__(self, name: str, others: frozenset[str]) -> None:
        self.name = name
        self.others = others  # the targets the named routes take

    def select(self, table: pa.Table) -> pa.Table:
        import pyarrow.compute as pc

        if "target" not in table.column_names:
            return table if self.name == DEFAULT_ROUTE else table.slice(0, 0)
        target = table.column("target")
        if self.name == DEFAULT_ROUTE:
            return table.filter(pc.is_null(target))
        if self.name == OTHER_TARGETS:
            named = pc.is_valid(target)
            known = pc.is_in(target, value_set=_strings(self.others))
            return table.filter(pc.and_(named, pc.invert(known)))
        return table.filter(pc.fill_null(pc.equal(target, self.name), False))


def _strings(names: frozenset[str]) -> pa.Array:
    import pyarrow as pa

    return pa.array(sorted(names), pa.string())


class Deliveries:
    """One :class:`BatchDelivery` per route (a target's name, :data:`DEFAULT_ROUTE` or
    :data:`OTHER_TARGETS`), each with its own thread and mark, and each taking its
    outcomes out of every batch: what :class:`BatchDelivery` does for one sink, for
    several that never wait for each other."""

    def __init__(self, routes: Mapping[str, OutcomeSink], outcomes_dir: Path,
                 checkpoint_dir: Path, max_behind: int = 2) -> None:
        if not routes:
            raise ValueError("routes must name at least one sink")
        named = frozenset(name for name in routes if name not in (DEFAULT_ROUTE,
                                                                   OTHER_TARGETS))
        start = _read_mark(mark_path(checkpoint_dir, DEFAULT_ROUTE))
        self.by_route: dict[str, BatchDelivery] = {}
        for name, sink in routes.items():
            mark = mark_path(checkpoint_dir, name)
            if start is not None and not mark.exists():
                # A target added to a checkpoint that delivered before: its outcomes
                # up to the default's mark went to the default route's sink.
                write_bytes_atomically(str(start).encode(), mark)
            self.by_route[name] = BatchDelivery(sink, outcomes_dir, mark, max_behind,
                                                route=_Route(name, named))

    def submit(self, batch_id: int, outcomes: pa.Table | list[Path]) -> None:
        for delivery in self.by_route.values():
            delivery.submit(batch_id, outcomes)

    def lag(self) -> DeliveryLag:
        """The furthest behind of the routes."""
        lags = [delivery.lag() for delivery in self.by_route.values()]
        return DeliveryLag(max(lag.batches for lag in lags), max(lag.lag_ms for lag in lags),
                           any(lag.from_files for lag in lags))

    def lags(self) -> dict[str, DeliveryLag]:
        return {name: delivery.lag() for name, delivery in self.by_route.items()}

    def close(self, *, raise_failure: bool = True, timeout_s: float | None = None) -> int:
        """:meth:`BatchDelivery.close` for every route, at once (one deadline for
        all); the outcomes left undelivered, over the routes."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        for delivery in self.by_route.values():
            delivery.begin_close()  # all at once: each finishes while the others do
        undelivered = 0
        failure: BaseException | None = None
        for delivery in self.by_route.values():
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                undelivered += delivery.close(raise_failure=raise_failure, timeout_s=left)
            except RuntimeError as exc:
                failure = failure or exc
        if failure is not None:
            raise failure
        return undelivered


def deliveries(sink: OutcomeSink | Mapping[str, OutcomeSink], outcomes_dir: Path,
               checkpoint_dir: Path) -> BatchDelivery | Deliveries:
    """An engine's delivery: one sink taking every outcome, or a sink per route."""
    if isinstance(sink, OutcomeSink):
        return BatchDelivery(sink, outcomes_dir, mark_path(checkpoint_dir, DEFAULT_ROUTE))
    return Deliveries(sink, outcomes_dir, checkpoint_dir)


def _read_mark(path: Path) -> int | None:
    try:
        return int(read_bytes_nofollow(path))
    except (FileNotFoundError, ValueError):
        return None


def _mtime_ms(paths: list[Path]) -> int | None:
    """When a batch's files were written: when it was handed over, near enough."""
    try:
        return min(os.stat(path, follow_symlinks=False).st_mtime_ns for path in paths) // 1_000_000
    except OSError:
        return None


def _read(path: Path) -> pa.Table:
    with open_parquet(path) as file:
        return file.read(use_threads=False)
