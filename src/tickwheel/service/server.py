"""SubmitServer: the HTTP API of a following service, on tickwheel's own asyncio loop.

- ``POST /v1/events``: one row, a JSON array of rows, or JSON Lines. Every row is
  validated as the engines parse it; one bad row refuses the request (400, with each
  row's reason) and nothing of it is written. A ``200`` means the rows are on disk in the
  input directory (:class:`~tickwheel.service.journal.SubmitJournal`): requests that
  arrive together share one file and one fsync, a group commit.
- ``Idempotency-Key`` header: a request sent again with the same key is answered again
  (``Idempotent-Replayed: true``) and not written again; with another body, 422.
- A row without ``ts_ms`` gets the server's wall clock, never below a time it gave.
  ``feed`` (:class:`~tickwheel.pipeline.engines.feed.IntakeFeed`, shared with the
  engine in this process) keeps the time floor that bounds the engine's time, so that
  such a row is never late, however long its commit or the engine's batch takes (with
  its ``floor_file``, the floor is also written there for an engine in another
  process); it also hands the engine each landed file's rows as parsed, and tells it
  when requests come, so that its batches give way to them.
- 503 with ``Retry-After`` when the engine is behind by more than ``max_backlog_rows``
  or the disk is (nearly) full; 413 for a body over ``max_body_bytes``.
- ``GET /v1/schedules`` (paged by id: ``prefix``, ``state``, ``limit``, ``cursor``),
  ``GET /v1/schedules/{id}`` and ``GET /v1/operations/{op_id}``: what the engine
  holds as of its last committed batch (``as_of_ms``), from a
  :class:`~tickwheel.service.view.StateView` the engine keeps up to date;
  ``PUT``, ``DELETE`` and ``POST .../pause|resume`` on a schedule write its row;
- ``GET /v1/status``: the engine's and the intake's counters as JSON;
  ``GET /metrics``: the Prometheus export, when the metrics extra is installed.

The server runs in a thread of its own, on :func:`tickwheel.aio.new_event_loop`, and
writes the journal from that thread too; the engine keeps the main thread. Needs the
``service`` extra (aiohttp).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import shutil
import threading
import time
import urllib.parse
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from tickwheel._histogram import Histogram, HistogramSnapshot
from tickwheel.pipeline.engines.feed import IntakeFeed
from tickwheel.pipeline.engines.following import FollowingEngine, engine_status
from tickwheel.pipeline.io.files import write_bytes_atomically
from tickwheel.service.api import IDEMPOTENCY_KEY, REPLAYED, RETRY_AFTER
from tickwheel.service.auth import authorized
from tickwheel.service.connections import (
    DEFAULT_HEADER_TIMEOUT_S,
    DEFAULT_MAX_CONNECTIONS,
    ConnectionGuard,
    connection_limit,
)
from tickwheel.service.console import (
    ASSETS,
    CONTENT_SECURITY_POLICY,
    MAX_LOGIN_BYTES,
    TOKEN_COOKIE,
    asset,
    cookie_authorized,
    cookie_value,
    login_page,
)
from tickwheel.service.history import SAMPLE_EVERY_S, History
from tickwheel.service.intake import (
    MAX_BODY_BYTES,
    SCHEDULE_ACTIONS,
    IntakeError,
    read_parsed_rows,
    schedule_row,
)
from tickwheel.service.journal import (
    DEFAULT_KEY_TTL_MS,
    Receipt,
    Submission,
    SubmitJournal,
    is_disk_full,
    wall_ms,
)
from tickwheel.service.view import DEFAULT_PAGE, MAX_PAGE, PageError, StateView

if TYPE_CHECKING:
    from aiohttp import web

__all__ = [
    "DEFAULT_COMMIT_INTERVAL_MS",
    "DEFAULT_MAX_BACKLOG_ROWS",
    "DEFAULT_MIN_FREE_BYTES",
    "FLOOR_FILE",
    "FLOOR_INTERVAL_MS",
    "RETIRE_INTERVAL_S",
    "SUBMIT_STATE",
    "IntakeStats",
    "SubmitServer",
    "parse_listen",
]

log = logging.getLogger(__name__)


#: A group commit starts at most this often: under load, requests share a file rather
#: than each landing one (the engine lists its input directory every batch).
DEFAULT_COMMIT_INTERVAL_MS: Final = 10
#: How often the free space of the input's disk is asked for (a statvfs).
_FREE_CHECK_S: Final = 0.25
DEFAULT_MAX_BACKLOG_ROWS: Final = 1_000_000
DEFAULT_MIN_FREE_BYTES: Final = 64 << 20
#: The server's directory in the checkpoint it shares with the engine (its keys).
SUBMIT_STATE: Final = "submit"
_RETRY_AFTER_S: Final = "1"
#: How often the files the engine has committed are retired from the input directory.
RETIRE_INTERVAL_S: Final = 1.0
_MAX_KEY_CHARS: Final = 255
#: How often ``floor_file`` is written: the time an engine that reads it may stand
#: behind the floor, besides its lateness bound.
FLOOR_INTERVAL_MS: Final = 50
#: The floor file's name in the server's directory, for the Spark engine's source.
FLOOR_FILE: Final = "floor"
#: The console's sign-in: the one request a service with a token takes without it.
_LOGIN: Final = ("POST", "/console/login")
#: The pending operations due first that ``/v1/status`` names.
_NEXT_DEADLINES: Final = 5


def parse_listen(value: str) -> tuple[str, int]:
    """``HOST:PORT`` or ``PORT`` (on 127.0.0.1); ``[::1]:PORT`` for IPv6."""
    host, sep, port = value.rpartition(":")
    if not sep:
        host, port = "127.0.0.1", value
    host = host.strip("[]") or "127.0.0.1"
    if not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"{value!r} is not HOST:PORT (a port in 0..65535)")
    return host, int(port)


@dataclass(frozen=True, slots=True)
class IntakeStats:
    """What the submit API has taken and refused since the server started."""

    requests: int
    accepted_rows: int
    commits: int
    replayed: int
    refused_bad: int
    refused_busy: int
    refused_too_large: int
    refused_unauthorized: int  # answered 401: no token, or a wrong one
    backlog_rows: int
    keys: int
    retired_files: int  # input files deleted once the engine committed them
    unretired_files: int  # input files landed and not yet retired
    writing_requests: int  # stamped, and not yet landed or refused
    connections: int  # open now
    refused_connections: int  # answered 503 at once: over the connection limit
    timed_out_connections: int  # closed: no request head within the header timeout
    floor_lag_ms: int  # how far the time floor stands behind the clock (time_floor)
    ack_ms: HistogramSnapshot  # from a request's arrival to its 200, rows written
    commit_wait_ms: HistogramSnapshot  # from a request's turn to its group commit's start
    land_ms: HistogramSnapshot  # a group commit: the file, the keys, their fsyncs

    def as_json(self) -> dict[str, Any]:
        """The counters, and each histogram as its count, mean, p50, p99 and maximum
        (the upper bound of the bucket that holds a quantile)."""
        out: dict[str, Any] = {}
        for name in self.__dataclass_fields__:
            value = getattr(self, name)
            out[name] = value if not isinstance(value, HistogramSnapshot) else {
                "count": value.count, "mean": round(value.mean, 2),
                "p50": value.quantile(0.5), "p99": value.quantile(0.99),
                "max": value.maximum}
        return out


@dataclass(slots=True)
class _Waiting:
    submission: Submission
    done: asyncio.Future[Receipt]
    queued: float  # time.perf_counter() when it joined the queue


class _Busy(Exception):
    """Answered 503: nothing was written; the client retries after Retry-After."""


class _Failed(Exception):
    """Answered 500: a commit failed for a reason other than the disk, and nothing of
    it was written; the service goes on with the next."""


def _unset_factory() -> asyncio.Protocol:
    raise RuntimeError("the connection guard has no protocol factory yet")


def _valid_key(key: str) -> bool:
    return 0 < len(key) <= _MAX_KEY_CHARS and key.isascii() and key.isprintable()


class SubmitServer:
    def __init__(self, input_dir: Path, state_dir: Path, *, host: str = "127.0.0.1",
                 port: int = 0, engine: FollowingEngine | None = None,
                 metrics: Callable[[], tuple[bytes, str]] | None = None,
                 clock: Callable[[], int] | None = None, max_future_ms: int | None = None,
                 max_backlog_rows: int = DEFAULT_MAX_BACKLOG_ROWS,
                 max_body_bytes: int = MAX_BODY_BYTES,
                 commit_interval_ms: int = DEFAULT_COMMIT_INTERVAL_MS,
                 min_free_bytes: int = DEFAULT_MIN_FREE_BYTES,
                 key_ttl_ms: int = DEFAULT_KEY_TTL_MS,
                 retire_interval_s: float = RETIRE_INTERVAL_S,
                 free_bytes: Callable[[Path], int] | None = None,
                 min_stamp_ms: int = 0, feed: IntakeFeed | None = None,
                 max_connections: int = DEFAULT_MAX_CONNECTIONS,
                 header_timeout_s: float = DEFAULT_HEADER_TIMEOUT_S,
                 token: str | None = None,
                 ready: Callable[[], bool] | None = None,
                 view: StateView | None = None,
                 delivery: Callable[[], Mapping[str, Any]] | None = None,
                 targets: frozenset[str] | None = None) -> None:
        # Without an engine's feed, one of its own: it stamps rows all the same. A feed
        # brings the clock it stamps with.
        if feed is not None and clock is not None:
            raise ValueError("give clock or feed (which has its clock), not both")
        self.feed = feed = IntakeFeed(clock or wall_ms) if feed is None else feed
        clock = feed.clock
        ConnectionGuard(_unset_factory, max_connections=max_connections,
                        header_timeout_s=header_timeout_s)  # refuses bad bounds now
        self.max_connections = max_connections
        self.header_timeout_s = header_timeout_s
        if token is not None and not token:
            raise ValueError("token must not be empty")
        self.token = token  # every request must carry it, if set
        self._guard: ConnectionGuard | None = None
        self.host, self.port = host, port
        self.input_dir = input_dir
        self.journal = SubmitJournal(input_dir, state_dir, clock=clock, key_ttl_ms=key_ttl_ms,
                                     hand_over=feed.offer)
        # The engine that reads what the server lands: its counts for /v1/status, the
        # rows it read for the backlog, the files it committed for their retirement.
        self.engine = engine
        self._ready = ready  # whether the engine runs yet; None: it runs from the start
        self.view = view  # what the engine holds, for the read API
        self.history = History()  # the console's charts
        self._delivery = delivery
        # The targets a row may name (None: any); a row naming another is refused.
        self.targets = targets
        self._read_at_start = 0 if engine is None else engine.rows_read
        self.retire_interval_s = retire_interval_s
        self._metrics = metrics
        self._clock = clock
        # Never below a time stamped before a restart either (the newest file's name),
        # nor below the engine's time at start (``min_stamp_ms``): a wall clock behind
        # a checkpoint's time would make every stamped row late.
        self._stamper = feed.stamper
        self._stamper.keep_above(max(self.journal.last_commit_ms, min_stamp_ms))
        self.floor_file = feed.floor_file
        self.max_future_ms = max_future_ms
        self.max_backlog_rows = max_backlog_rows
        self.max_body_bytes = max_body_bytes
        self.commit_interval_ms = commit_interval_ms
        self.min_free_bytes = min_free_bytes
        self._free_bytes = free_bytes or (lambda path: shutil.disk_usage(path).free)
        self._free, self._free_checked = 0, -_FREE_CHECK_S
        self._counts = dict.fromkeys(("requests", "accepted_rows", "commits", "replayed",
                                      "refused_bad", "refused_busy", "refused_too_large",
                                      "refused_unauthorized"), 0)
        self._waiting: list[_Waiting] = []
        self._ack_ms, self._commit_wait_ms, self._land_ms = Histogram(), Histogram(), Histogram()
        self._inflight: dict[str, asyncio.Future[Receipt]] = {}
        self._wake: asyncio.Event | None = None
        self._stopping: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._started = threading.Event()
        self._failure: BaseException | None = None

    # -- lifecycle -----------------------------------------------------------------

    def start(self) -> None:
        """Serve from a thread of its own; returns once the port is bound (OSError if
        it cannot be: in use, or not this machine's address)."""
        from tickwheel.aio import new_event_loop

        if self.floor_file is not None:  # before any stamp: a reader finds it at once
            self._publish_floor(self.floor_file)
        loop = new_event_loop()
        self._loop = loop
        self._thread = threading.Thread(target=self._serve, args=(loop,),
                                        name="tickwheel-submit-server", daemon=True)
        self._thread.start()
        self._started.wait()
        if self._failure is not None:
            self._thread.join()
            raise self._failure

    def _serve(self, loop: asyncio.AbstractEventLoop) -> None:
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(self._main())
        except BaseException as exc:  # reported to start(), or logged after it
            if not self._started.is_set():
                self._failure = exc
            else:
                log.exception("the submit server stopped")
        finally:
            self._started.set()
            with contextlib.suppress(RuntimeError):  # deletes under way finish first
                loop.run_until_complete(loop.shutdown_default_executor())
            loop.close()

    async def _main(self) -> None:
        from aiohttp import web

        self._wake = asyncio.Event()
        self._stopping = asyncio.Event()
        guard = ConnectionGuard(_unset_factory,  # aiohttp's, once the runner has made it
                                max_connections=connection_limit(self.max_connections),
                                header_timeout_s=self.header_timeout_s)

        token = self.token

        @web.middleware
        async def guarded(request: web.Request,
                          handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
                          ) -> web.StreamResponse:
            if (token is not None and (request.method, request.path) != _LOGIN
                    and not authorized(request.headers.get("Authorization"), token)
                    and not cookie_authorized(request.cookies.get(TOKEN_COOKIE), token)):
                self._counts["refused_unauthorized"] += 1
                headers = {"WWW-Authenticate": 'Bearer realm="tickwheel"',
                           "Connection": "close"}  # the body is never read
                if request.method == "GET" and request.path == "/":  # a browser: sign in
                    return self._page(401, login_page(), headers)
                return self._json(401, {"error": "this service needs Authorization: "
                                                 "Bearer <token>"}, headers)
            self.feed.arrived()  # the engine's batches give way to what comes
            response: web.StreamResponse = await guard.middleware(request, handler)
            return response

        app = web.Application(client_max_size=self.max_body_bytes, middlewares=[guarded])
        app.router.add_post("/v1/events", self._post_events)
        app.router.add_put("/v1/schedules/{id}", self._manage_schedule)
        app.router.add_delete("/v1/schedules/{id}", self._manage_schedule)
        app.router.add_post("/v1/schedules/{id}/{action:pause|resume}", self._manage_schedule)
        app.router.add_get("/v1/schedules", self._get_schedules)
        app.router.add_get("/v1/schedules/{id}", self._get_schedule)
        app.router.add_get("/v1/operations/{op_id}", self._get_operation)
        app.router.add_get("/v1/outcomes/recent", self._get_recent_outcomes)
        app.router.add_get("/v1/history", self._get_history)
        app.router.add_get("/", self._get_console)
        app.router.add_get("/console/{name}", self._get_asset)
        app.router.add_post(_LOGIN[1], self._post_login)
        app.router.add_get("/v1/status", self._get_status)
        app.router.add_get("/metrics", self._get_metrics)
        # An idle keep-alive connection goes as one that sends no request head does:
        # the guard closes it (aiohttp's own keep-alive timeout is longer).
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=5.0,
                               keepalive_timeout=2 * self.header_timeout_s)
        await runner.setup()
        assert runner.server is not None
        guard.factory = runner.server
        self._guard = guard
        committer = asyncio.create_task(self._commit_loop())
        retirer = asyncio.create_task(self._retire_loop())
        publisher = asyncio.create_task(self._floor_loop())
        sampler = asyncio.create_task(self._sample_loop())
        listener: asyncio.Server | None = None
        try:
            listener = await asyncio.get_running_loop().create_server(
                guard.protocol, self.host, self.port)
            self.port = int(listener.sockets[0].getsockname()[1])
            self._started.set()
            await self._stopping.wait()
        finally:
            if listener is not None:
                listener.close()  # no new connection from here
            await runner.cleanup()  # answers the requests in progress first
            for task in (committer, retirer, publisher, sampler):
                task.cancel()
            await asyncio.gather(committer, retirer, publisher, sampler,
                                 return_exceptions=True)

    def stop(self) -> None:
        """Stop taking requests; those in progress are answered first."""
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        stopping = self._stopping
        if stopping is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(stopping.set)
        thread.join(timeout=30)
        self.journal.close()

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def __enter__(self) -> SubmitServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- the state -----------------------------------------------------------------

    def backlog_rows(self) -> int:
        """Rows acknowledged that the engine has not read yet: rows written since the
        start less rows read since (other writers' rows make it an underestimate)."""
        if self.engine is None:
            return 0
        read = self.engine.rows_read - self._read_at_start
        return max(0, self._counts["accepted_rows"] - read)

    def stats(self) -> IntakeStats:
        journal = self.journal.stats()
        floor = self._stamper.floor()
        guard = self._guard
        return IntakeStats(**self._counts, backlog_rows=self.backlog_rows(),
                           keys=journal.keys, retired_files=journal.retired,
                           unretired_files=journal.unretired,
                           writing_requests=self._stamper.held(),
                           connections=0 if guard is None else len(guard.open),
                           refused_connections=0 if guard is None else guard.refused,
                           timed_out_connections=0 if guard is None else guard.timed_out,
                           floor_lag_ms=max(0, self._clock() - floor),
                           ack_ms=self._ack_ms.snapshot(),
                           commit_wait_ms=self._commit_wait_ms.snapshot(),
                           land_ms=self._land_ms.snapshot())

    def _check_room(self) -> None:
        behind = self.backlog_rows()
        if behind > self.max_backlog_rows:
            raise _Busy(f"the engine is {behind:,} rows behind (at most "
                        f"{self.max_backlog_rows:,})")
        now = time.monotonic()
        if now - self._free_checked >= _FREE_CHECK_S:
            self._free, self._free_checked = self._free_bytes(self.input_dir), now
        free = self._free
        if free < self.min_free_bytes:
            raise _Busy(f"{free:,} bytes free on the input's disk (at least "
                        f"{self.min_free_bytes:,} wanted)")

    # -- the handlers -------------------------------------------------------------

    @staticmethod
    def _json(status: int, body: Mapping[str, Any],
              headers: Mapping[str, str] | None = None) -> web.Response:
        from aiohttp import web

        return web.Response(status=status, text=json.dumps(body, separators=(",", ":")),
                            content_type="application/json", headers=headers)

    def _busy(self, why: str) -> web.Response:
        self._counts["refused_busy"] += 1
        return self._json(503, {"error": why}, {RETRY_AFTER: _RETRY_AFTER_S})

    async def _read(self, request: web.Request) -> bytes | web.Response:
        """The body, or the answer that refuses it (413 without reading a body that
        says it is too large)."""
        from aiohttp import web

        if request.content_length is not None and request.content_length > self.max_body_bytes:
            return self._too_large()
        try:
            return await request.read()
        except web.HTTPRequestEntityTooLarge:
            return self._too_large()

    def _too_large(self) -> web.Response:
        self._counts["refused_too_large"] += 1
        return self._json(413, {"error": f"the body is over {self.max_body_bytes:,} "
                                         "bytes: split it"})

    async def _post_events(self, request: web.Request) -> web.Response:
        return await self._take(request, None)

    async def _manage_schedule(self, request: web.Request) -> web.Response:
        """``PUT /v1/schedules/{id}`` (its fields), ``POST .../pause``, ``.../resume``
        and ``DELETE``: the matching row, taken as ``POST /v1/events`` takes rows."""
        action = request.match_info.get("action")
        kind = {"PUT": "schedule", "DELETE": "unschedule"}.get(request.method, action)
        assert kind in SCHEDULE_ACTIONS, (request.method, action)
        return await self._take(request, kind)

    async def _body(self, request: web.Request, key: str | None,
                    schedule_kind: str | None) -> bytes | web.Response:
        """The rows a request submits, or the answer that refuses it."""
        if key is not None and not _valid_key(key):
            self._counts["refused_bad"] += 1
            return self._json(400, {"error": f"Idempotency-Key: 1 to {_MAX_KEY_CHARS} "
                                             "printable ASCII characters"})
        body = await self._read(request)
        if not isinstance(body, bytes) or schedule_kind is None:
            return body
        try:
            return schedule_row(schedule_kind, request.match_info["id"], body)
        except IntakeError as exc:
            self._counts["refused_bad"] += 1
            return self._json(400, exc.as_json())

    async def _take(self, request: web.Request, schedule_kind: str | None) -> web.Response:
        """Rows of the request (its body's, or a management request's one row) through
        the group commit."""
        arrived = time.perf_counter()
        self._counts["requests"] += 1
        key = request.headers.get(IDEMPOTENCY_KEY)
        body = await self._body(request, key, schedule_kind)
        if not isinstance(body, bytes):
            return body
        # A management request's key stands for its row: the same key on another
        # schedule, or another action, is another body.
        digest = hashlib.blake2b(body, digest_size=16).hexdigest()
        if key is not None:
            replayed = await self._replay(key, digest)
            if replayed is not None:
                return replayed
        try:
            self._check_room()
        except _Busy as exc:
            return self._busy(str(exc))
        stamp = self._stamper.stamp()
        bound = None if self.max_future_ms is None else self._clock() + self.max_future_ms
        try:
            parsed = read_parsed_rows(body, stamp, max_ts_ms=bound, targets=self.targets)
        except IntakeError as exc:
            self._stamper.settle(stamp)
            self._counts["refused_bad"] += 1
            return self._json(400, exc.as_json())
        except BaseException:  # a stamp held would stop the engine's time
            self._stamper.settle(stamp)
            raise
        return await self._commit(Submission(parsed.lines, key, digest, stamp, parsed.rows),
                                  arrived)

    async def _commit(self, submission: Submission, arrived: float) -> web.Response:
        """Answered once the next group commit has landed ``submission``."""
        done: asyncio.Future[Receipt] = asyncio.get_running_loop().create_future()
        key = submission.key
        if key is not None:
            self._inflight[key] = done
        self._waiting.append(_Waiting(submission, done, time.perf_counter()))
        assert self._wake is not None
        self._wake.set()
        try:
            receipt = await asyncio.shield(done)
        except _Busy as exc:
            return self._busy(str(exc))
        except _Failed as exc:
            return self._json(500, {"error": str(exc)})
        finally:
            if key is not None and self._inflight.get(key) is done:
                del self._inflight[key]
        response = self._json(200, receipt.as_json())
        self._ack_ms.record(round((time.perf_counter() - arrived) * 1000))
        return response

    async def _replay(self, key: str, digest: str) -> web.Response | None:
        """The answer already given for ``key`` (or being given), or None."""
        inflight = self._inflight.get(key)
        if inflight is not None:
            try:
                await asyncio.shield(inflight)
            except (_Busy, _Failed):
                return None  # it was not written: this one may try
        found = self.journal.replay(key)
        if found is None:
            return None
        first_digest, receipt = found
        if first_digest != digest:
            self._counts["refused_bad"] += 1
            return self._json(422, {"error": "this Idempotency-Key came with another body"})
        self._counts["replayed"] += 1
        return self._json(200, receipt.as_json(), {REPLAYED: "true"})

    async def _commit_loop(self) -> None:
        """Group commits: requests that arrive while one is written, or within
        ``commit_interval_ms`` of its start, share the next."""
        assert self._wake is not None
        last = 0.0
        while True:
            await self._wake.wait()
            self._wake.clear()
            gap = self.commit_interval_ms / 1000 - (time.monotonic() - last)
            if gap > 0:  # requests that come meanwhile share this commit
                await asyncio.sleep(gap)
            batch, self._waiting = self._waiting, []
            if not batch:
                continue
            last = time.monotonic()
            started = time.perf_counter()
            self._commit_wait_ms.record_many(round((started - w.queued) * 1000) for w in batch)
            try:
                # On the loop's thread: a writer thread would wait for the interpreter's
                # lock after each of the landing's syscalls, which costs the loop more
                # than the fsyncs it would overlap (docs/service.md).
                receipts = self.journal.land([w.submission for w in batch])
            except OSError as exc:
                why = ("the input's disk is full" if is_disk_full(exc)
                       else f"the input could not be written: {exc.strerror or exc}")
                log.error("a commit of %d requests failed: %s", len(batch), why)
                self._fail(batch, _Busy(why))
                continue
            except Exception:  # one commit's fault never ends the loop
                log.exception("a commit of %d requests failed", len(batch))
                self._fail(batch, _Failed("the rows could not be written; nothing of them "
                                          "was kept"))
                continue
            finally:  # landed (the engine lists them) or refused: time need not wait
                for waiting in batch:
                    self._stamper.settle(waiting.submission.ts_ms)
            self._land_ms.record(round((time.perf_counter() - started) * 1000))
            self._counts["commits"] += 1
            for waiting, receipt in zip(batch, receipts, strict=True):
                self._counts["accepted_rows"] += receipt.accepted
                waiting.done.set_result(receipt)

    @staticmethod
    def _fail(batch: list[_Waiting], error: Exception) -> None:
        for waiting in batch:
            if not waiting.done.done():
                waiting.done.set_exception(error)

    async def _retire_loop(self) -> None:
        """Input files the engine has committed deleted, every ``retire_interval_s``:
        a service's input directory holds what is still to be read, not its history."""
        if self.engine is None:
            return
        committed = self.engine.committed_inputs
        while True:
            await asyncio.sleep(self.retire_interval_s)
            try:
                names = self.journal.take_retired(committed)
                # Deleted off the loop: each unlink gives up the interpreter's lock,
                # and winning it back from a busy engine can take the switch interval.
                retired = (await asyncio.to_thread(self.journal.delete_retired, names)
                           if names else 0)
            except OSError as exc:  # tried again at the next round
                log.warning("retiring committed input files: %s", exc)
                continue
            if retired:
                log.debug("%d committed input files retired", retired)

    async def _floor_loop(self) -> None:
        """The floor written to ``floor_file`` every ``FLOOR_INTERVAL_MS``: an engine
        that reads it holds its time within the lateness bound of it (a stale floor
        is lower, so holds time more, never less)."""
        path = self.floor_file
        if path is None:
            return
        while True:
            await asyncio.sleep(FLOOR_INTERVAL_MS / 1000)
            try:
                self._publish_floor(path)
            except OSError as exc:  # the engine's time waits meanwhile; tried again
                log.warning("writing the time floor to %s: %s", path, exc)

    def _publish_floor(self, path: Path) -> None:
        # Not fsync'd: a start writes it again before it stamps anything.
        write_bytes_atomically(b"%d\n" % self._stamper.floor(), path, sync=False)

    async def _get_status(self, request: web.Request) -> web.Response:
        status = {} if self.engine is None else engine_status(self.engine)
        ready = self._ready is None or self._ready()
        body = {"ready": ready, "engine": status, "intake": self.stats().as_json()}
        if self.view is not None:
            body["state"] = self.view.stats(next_deadlines=_NEXT_DEADLINES).as_json()
        if self._delivery is not None:
            body["delivery"] = dict(self._delivery())
        return self._json(200, body)

    # -- the console ----------------------------------------------------------------

    def sample(self, now_ms: int) -> None:
        """Take a sample of the counters for :attr:`history` (every few seconds)."""
        view = self.view
        self.history.sample(now_ms, self._counts["accepted_rows"],
                            0 if view is None else view.fired,
                            0 if view is None else view.resolved_total,
                            self._ack_ms.snapshot())

    async def _sample_loop(self) -> None:
        while True:
            self.sample(wall_ms())
            await asyncio.sleep(SAMPLE_EVERY_S)

    @staticmethod
    def _page(status: int, text: str, headers: Mapping[str, str] | None = None,
              content_type: str = "text/html") -> web.Response:
        from aiohttp import web

        response = web.Response(status=status, text=text, content_type=content_type,
                                headers=headers)
        response.headers["Content-Security-Policy"] = CONTENT_SECURITY_POLICY
        response.headers["X-Content-Type-Options"] = "nosniff"
        response.headers["Cache-Control"] = "no-store"
        return response

    async def _get_console(self, request: web.Request) -> web.Response:
        return self._page(200, asset("index.html").decode())

    async def _get_asset(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        content_type = ASSETS.get(name)
        if content_type is None:
            return self._json(404, {"error": f"no console file {name!r}"})
        kind, _, charset = content_type.partition("; charset=")
        response = self._page(200, asset(name).decode(), content_type=kind)
        response.charset = charset
        return response

    async def _post_login(self, request: web.Request) -> web.Response:
        """A browser's sign-in: the token in a form, answered with the console's cookie
        and a way back to the page, or the page again saying it was wrong."""
        from aiohttp import web

        back = web.Response(status=303, headers={"Location": "/"})
        if self.token is None:
            return back
        if (request.content_length or 0) > MAX_LOGIN_BYTES:
            return self._too_large()
        form = urllib.parse.parse_qs(
            (await request.content.read(MAX_LOGIN_BYTES + 1)).decode("utf-8", "replace"))
        given = (form.get("token") or [""])[0].strip()
        if not authorized(f"Bearer {given}", self.token):
            self._counts["refused_unauthorized"] += 1
            return self._page(401, login_page("That is not the token of this service."))
        back.set_cookie(TOKEN_COOKIE, cookie_value(self.token), httponly=True,
                        samesite="Strict", path="/")
        return back

    async def _get_recent_outcomes(self, request: web.Request) -> web.Response:
        if self.view is None:
            return self._no_view()
        return self._json(200, {"outcomes": [o.as_json() for o in self.view.recent_outcomes()],
                                "as_of_ms": self.view.as_of_ms})

    async def _get_history(self, request: web.Request) -> web.Response:
        return self._json(200, {"every_s": SAMPLE_EVERY_S,
                                "samples": [s.as_json() for s in self.history.samples()]})

    # -- reading what the engine holds ------------------------------------------------

    def _no_view(self) -> web.Response:
        return self._json(404, {"error": "this service's engine offers no read view"})

    async def _get_schedules(self, request: web.Request) -> web.Response:
        if self.view is None:
            return self._no_view()
        query = request.query
        unknown = sorted(set(query) - {"prefix", "state", "limit", "cursor"})
        if unknown:
            return self._json(400, {"error": f"unknown query parameter {unknown[0]!r}"})
        limit_text = query.get("limit", str(DEFAULT_PAGE))
        if not limit_text.isdigit() or len(limit_text) > 6:
            return self._json(400, {"error": f"limit: from 1 to {MAX_PAGE}, "
                                             f"not {limit_text!r}"})
        try:
            page = self.view.page(prefix=query.get("prefix", ""), state=query.get("state"),
                                  limit=int(limit_text), cursor=query.get("cursor"))
        except PageError as exc:
            return self._json(400, {"error": str(exc)})
        return self._json(200, page.as_json())

    async def _get_schedule(self, request: web.Request) -> web.Response:
        if self.view is None:
            return self._no_view()
        schedule_id = request.match_info["id"]
        found = self.view.schedule(schedule_id)
        if found is None:
            return self._json(404, {"error": f"no schedule {schedule_id!r}",
                                    "as_of_ms": self.view.as_of_ms})
        return self._json(200, {**found.as_json(), "as_of_ms": self.view.as_of_ms})

    async def _get_operation(self, request: web.Request) -> web.Response:
        if self.view is None:
            return self._no_view()
        op_id = request.match_info["op_id"]
        found = self.view.operation(op_id)
        if found is None:
            return self._json(404, {"error": f"no operation {op_id!r} pending or "
                                             "remembered", "as_of_ms": self.view.as_of_ms})
        return self._json(200, {**found.as_json(), "as_of_ms": self.view.as_of_ms})

    async def _get_metrics(self, request: web.Request) -> web.Response:
        from aiohttp import web

        if self._metrics is None:
            return self._json(404, {"error": "metrics need the metrics extra: "
                                             "pip install 'tickwheel[metrics]'"})
        body, content_type = self._metrics()
        response = web.Response(body=body)
        response.headers["Content-Type"] = content_type
        return response
