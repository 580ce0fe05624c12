"""Clients of a following service's submit API (``tickwheel run --follow --listen``).

:class:`Client` (blocking) and :class:`AsyncClient` send rows to ``POST /v1/events``.
Every call carries an ``Idempotency-Key`` (a fresh UUID unless given) and keeps it
across its retries, so a retry after a lost answer is not written twice. Congestion
(503, 429), other 5xx, timeouts and refused connections are retried with exponential
backoff and jitter, after ``Retry-After`` where the server names it; a row the server
refuses raises :class:`RowsRefused` with each row's reason. Needs the ``service`` extra.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
import urllib.parse
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Final

from tickwheel.schedules import Schedule
from tickwheel.service.api import (
    IDEMPOTENCY_KEY,
    REPLAYED,
    RETRIED_STATUSES,
    RETRY_AFTER,
    RefusedRow,
)

if TYPE_CHECKING:
    import httpx

__all__ = [
    "Accepted",
    "AsyncClient",
    "Client",
    "RefusedRow",
    "RowsRefused",
    "SubmitError",
    "SubmitUnavailable",
]

DEFAULT_TIMEOUT_S: Final = 10.0
DEFAULT_RETRIES: Final = 8


class SubmitError(Exception):
    """The server refused a request for good (it is not retried)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class RowsRefused(SubmitError):
    """Rows no engine would apply (400): nothing of the request is written."""

    def __init__(self, message: str, refused: tuple[RefusedRow, ...]) -> None:
        super().__init__(message, 400)
        self.refused = refused


class SubmitUnavailable(SubmitError):
    """Still congested or unreachable after every retry: the rows may or may not have
    been written; sending them again with the same idempotency key is safe."""


@dataclass(frozen=True, slots=True)
class Accepted:
    """The rows are on disk in the service's input: they will be applied."""

    accepted: int
    file: str
    ts_ms: int
    replayed: bool
    idempotency_key: str


def _epoch_ms(when: int | datetime) -> int:
    if isinstance(when, datetime):
        if when.tzinfo is None:
            raise ValueError(f"{when!r} has no time zone: give an aware datetime")
        return round(when.timestamp() * 1000)
    if isinstance(when, bool) or not isinstance(when, int):
        raise TypeError(f"a time is epoch milliseconds (int) or an aware datetime, "
                        f"got {when!r}")
    return when


def _request(rows: Mapping[str, Any] | Iterable[Mapping[str, Any]],
             idempotency_key: str | None) -> tuple[bytes, str, dict[str, str]]:
    """A submission's body (JSON Lines), its key (a fresh UUID unless given) and
    headers: the same for every attempt."""
    listed = [dict(rows)] if isinstance(rows, Mapping) else [dict(r) for r in rows]
    return _lines_request([json.dumps(r, separators=(",", ":")) for r in listed],
                          idempotency_key)


def _lines_request(lines: Iterable[str], idempotency_key: str | None,
                   ) -> tuple[bytes, str, dict[str, str]]:
    """:func:`_request` for rows already written as JSON text, sent as they are."""
    listed = list(lines)
    if not listed:
        raise ValueError("no rows to submit")
    for index, line in enumerate(listed):
        if "\n" in line or "\r" in line:
            raise ValueError(f"row {index} spans lines: one JSON object a line")
    body = "".join(f"{line}\n" for line in listed).encode("utf-8")
    key = idempotency_key or str(uuid.uuid4())
    return body, key, {IDEMPOTENCY_KEY: key, "Content-Type": "application/x-ndjson"}


def _auth_headers(token: str | None) -> dict[str, str]:
    if token is None:
        return {}
    if not token or not token.isascii() or not token.isprintable() or " " in token:
        raise ValueError("token must be printable ASCII without spaces")
    return {"Authorization": f"Bearer {token}"}


def _receipt(response: httpx.Response, key: str) -> Accepted:
    """A 200's body as the submit API writes it, or SubmitError saying what came."""
    try:
        body = response.json()
        accepted, file, ts_ms = body["accepted"], body["file"], body["ts_ms"]
        if not (type(accepted) is int and type(ts_ms) is int and isinstance(file, str)):
            raise TypeError
    except (ValueError, TypeError, KeyError):
        shown = response.text[:200] or "an empty body"
        raise SubmitError(f"{response.url} answered 200 with {shown!r}, not the submit "
                          "API's answer: is the URL the service's (a proxy, or another "
                          "server)?", 200) from None
    return Accepted(accepted, file, ts_ms,
                    response.headers.get(REPLAYED) == "true", key)


class _Attempts:
    """The retry rule both clients share: what an answer means, how long to wait."""

    def __init__(self, retries: int, backoff_s: float, max_backoff_s: float) -> None:
        self.retries = retries
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.attempt = 0
        self.last: str = ""

    def wait_s(self, retry_after: str | None) -> float | None:
        """Seconds before the next attempt, or None when none is left."""
        self.attempt += 1
        if self.attempt > self.retries:
            return None
        delay = min(self.max_backoff_s, self.backoff_s * 2 ** (self.attempt - 1))
        delay *= 0.5 + random.random() / 2  # jitter: retrying clients spread out
        if retry_after is not None and retry_after.isdigit():
            delay = max(delay, min(float(retry_after), self.max_backoff_s))
        return float(delay)

    def outcome(self, response: httpx.Response, key: str) -> Accepted | None:
        """The accepted answer; None to retry; SubmitError to give up."""
        status = response.status_code
        if status == 200:
            return _receipt(response, key)
        if status in RETRIED_STATUSES:
            self.last = f"{status} {response.text[:200]}"
            return None
        try:
            body = response.json()
            if not isinstance(body, dict):
                raise TypeError
        except (ValueError, TypeError):
            body = {"error": response.text[:200]}
        message = str(body.get("error", f"answered {status}"))
        refused = body.get("refused")
        if status == 400 and refused and isinstance(refused, list):
            try:
                rows = tuple(RefusedRow(int(r["index"]), str(r["reason"]), str(r["row"]))
                             for r in refused)
            except (TypeError, KeyError, ValueError):
                rows = ()
            if rows:
                raise RowsRefused(message, rows)
        raise SubmitError(f"{message} ({status})", status)

    def unavailable(self, url: str) -> SubmitUnavailable:
        return SubmitUnavailable(f"{url}: no answer taken after {self.retries} retries "
                                 f"(last: {self.last})")


def _path_part(text: str) -> str:
    return urllib.parse.quote(text, safe="")


def _page_params(prefix: str, state: str | None, limit: int | None,
                 cursor: str | None) -> dict[str, str]:
    params = {"prefix": prefix} if prefix else {}
    if state is not None:
        params["state"] = state
    if limit is not None:
        params["limit"] = str(limit)
    if cursor is not None:
        params["cursor"] = cursor
    return params


def _read(response: httpx.Response, missing_ok: bool = False) -> dict[str, Any] | None:
    """A read's JSON answer; None for a 404 where ``missing_ok``; else SubmitError."""
    if missing_ok and response.status_code == 404:
        return None
    if response.status_code != 200:
        try:
            error = response.json().get("error", response.text)
        except (ValueError, AttributeError):
            error = response.text[:200]
        raise SubmitError(f"{response.request.method} {response.request.url.path}: "
                          f"{response.status_code} {error}", response.status_code)
    try:
        body = response.json()
    except ValueError as exc:
        raise SubmitError(f"{response.request.url.path}: an answer that is not JSON",
                          200) from exc
    if not isinstance(body, dict):
        raise SubmitError(f"{response.request.url.path}: an answer that is not a JSON "
                          "object", 200)
    return body


class _Readiness:
    """The wait both clients' ``wait_ready`` share: what a status says, and when to
    give up."""

    def __init__(self, url: str, timeout_s: float) -> None:
        self.url = url
        self.timeout_s = timeout_s
        self.deadline = time.monotonic() + timeout_s

    def ready(self, status: dict[str, Any]) -> bool:
        """Whether ``status`` says the engine runs; SubmitUnavailable past the time."""
        if status.get("ready", True):
            return True
        self._check("the engine is starting")
        return False

    def failed(self, exc: Exception) -> None:
        self._check(f"{type(exc).__name__}: {exc}")

    def _check(self, last: str) -> None:
        if time.monotonic() >= self.deadline:
            raise SubmitUnavailable(f"{self.url}: not ready within {self.timeout_s:g} s "
                                    f"(last: {last})")


def _carrying(row: dict[str, Any], target: str | None, payload: Any) -> dict[str, Any]:
    if target is not None:
        row["target"] = target
    if payload is not None:
        row["payload"] = payload
    return row


class _Rows:
    """The row-building calls both clients share."""

    @staticmethod
    def watch_row(op_id: str, when: int | datetime, *, keys: Iterable[str] = (),
                  condition: str = "none", targets: Mapping[str, int] | None = None,
                  min_total: int | None = None, ts_ms: int | None = None,
                  target: str | None = None, payload: Any = None) -> dict[str, Any]:
        row: dict[str, Any] = {"type": "watch", "op_id": op_id,
                               "deadline_ms": _epoch_ms(when), "condition": condition,
                               "keys": list(keys)}
        if targets is not None:
            row["targets"] = dict(targets)
        if min_total is not None:
            row["min_total"] = min_total
        if ts_ms is not None:
            row["ts_ms"] = ts_ms
        return _carrying(row, target, payload)

    @staticmethod
    def cancel_row(op_id: str, ts_ms: int | None = None) -> dict[str, Any]:
        row: dict[str, Any] = {"type": "cancel", "op_id": op_id}
        if ts_ms is not None:
            row["ts_ms"] = ts_ms
        return row

    @staticmethod
    def schedule_row(schedule_id: str, schedule: Schedule | Mapping[str, Any], *,
                     ts_ms: int | None = None, target: str | None = None,
                     payload: Any = None) -> dict[str, Any]:
        """A ``schedule`` row: a :class:`~tickwheel.Schedule`, or its fields (checked
        here as the service checks them: a bad spec raises ``ScheduleError``)."""
        spec = schedule if isinstance(schedule, Schedule) else Schedule.from_fields(
            dict(schedule))
        row: dict[str, Any] = {"type": "schedule", "schedule_id": schedule_id,
                               **spec.to_fields()}
        if ts_ms is not None:
            row["ts_ms"] = ts_ms
        return _carrying(row, target, payload)

    @staticmethod
    def series_row(kind: str, schedule_id: str, ts_ms: int | None = None) -> dict[str, Any]:
        """An ``unschedule``, ``pause`` or ``resume`` row."""
        if kind not in ("unschedule", "pause", "resume"):
            raise ValueError(f"kind must be unschedule, pause or resume, got {kind!r}")
        row: dict[str, Any] = {"type": kind, "schedule_id": schedule_id}
        if ts_ms is not None:
            row["ts_ms"] = ts_ms
        return row


class Client(_Rows):
    """A blocking client of one service. Thread-safe, as its httpx client is.
    ``token``: the service's bearer token (``--token-file``), sent with every request."""

    def __init__(self, url: str, *, timeout_s: float = DEFAULT_TIMEOUT_S,
                 retries: int = DEFAULT_RETRIES, backoff_s: float = 0.05,
                 max_backoff_s: float = 5.0, token: str | None = None,
                 transport: httpx.BaseTransport | None = None) -> None:
        import httpx

        self.url = url.rstrip("/")
        self._retry = (retries, backoff_s, max_backoff_s)
        self._http = httpx.Client(timeout=timeout_s, transport=transport,
                                  headers=_auth_headers(token))

    def submit(self, rows: Mapping[str, Any] | Iterable[Mapping[str, Any]], *,
               idempotency_key: str | None = None) -> Accepted:
        """Rows of the event log (any of its row types, schedules too), durably taken."""
        return self._send(_request(rows, idempotency_key))

    def _send(self, request: tuple[bytes, str, dict[str, str]]) -> Accepted:
        import httpx

        body, key, headers = request
        attempts = _Attempts(*self._retry)
        while True:
            retry_after = None
            try:
                response = self._http.post(f"{self.url}/v1/events", content=body,
                                           headers=headers)
            except httpx.TransportError as exc:  # refused, reset, timed out
                attempts.last = f"{type(exc).__name__}: {exc}"
            else:
                accepted = attempts.outcome(response, key)
                if accepted is not None:
                    return accepted
                retry_after = response.headers.get(RETRY_AFTER)
            delay = attempts.wait_s(retry_after)
            if delay is None:
                raise attempts.unavailable(self.url)
            time.sleep(delay)

    def submit_lines(self, lines: Iterable[str], *,
                     idempotency_key: str | None = None) -> Accepted:
        """Rows already written as JSON text, one object a line, sent as they are: the
        service judges them exactly as it judges a file's lines."""
        return self._send(_lines_request(lines, idempotency_key))

    def schedule_at(self, op_id: str, when: int | datetime, *, keys: Iterable[str] = (),
                    condition: str = "none", targets: Mapping[str, int] | None = None,
                    min_total: int | None = None, ts_ms: int | None = None,
                    idempotency_key: str | None = None, target: str | None = None,
                    payload: Any = None) -> Accepted:
        """"Do ``op_id`` at ``when`` unless it is cancelled first" (``condition``
        ``none``), or a watch with another condition on ``keys``; its outcome goes to
        ``target`` (a name the service's targets file defines) with ``payload``."""
        return self.submit(self.watch_row(op_id, when, keys=keys, condition=condition,
                                          targets=targets, min_total=min_total,
                                          ts_ms=ts_ms, target=target, payload=payload),
                           idempotency_key=idempotency_key)

    def cancel(self, op_id: str, *, ts_ms: int | None = None,
               idempotency_key: str | None = None) -> Accepted:
        return self.submit(self.cancel_row(op_id, ts_ms), idempotency_key=idempotency_key)

    def schedule(self, schedule_id: str, schedule: Schedule | Mapping[str, Any], *,
                 ts_ms: int | None = None, idempotency_key: str | None = None,
                 target: str | None = None, payload: Any = None) -> Accepted:
        """Start (or replace) a recurring schedule: each occurrence fires once, to
        ``target`` with ``payload``."""
        return self.submit(self.schedule_row(schedule_id, schedule, ts_ms=ts_ms,
                                             target=target, payload=payload),
                           idempotency_key=idempotency_key)

    def unschedule(self, schedule_id: str, *, ts_ms: int | None = None,
                   idempotency_key: str | None = None) -> Accepted:
        return self.submit(self.series_row("unschedule", schedule_id, ts_ms),
                           idempotency_key=idempotency_key)

    def pause(self, schedule_id: str, *, ts_ms: int | None = None,
              idempotency_key: str | None = None) -> Accepted:
        return self.submit(self.series_row("pause", schedule_id, ts_ms),
                           idempotency_key=idempotency_key)

    def resume(self, schedule_id: str, *, ts_ms: int | None = None,
               idempotency_key: str | None = None) -> Accepted:
        """Occurrences of the pause are decided by the schedule's misfire policy."""
        return self.submit(self.series_row("resume", schedule_id, ts_ms),
                           idempotency_key=idempotency_key)

    def status(self) -> dict[str, Any]:
        response = self._http.get(f"{self.url}/v1/status")
        response.raise_for_status()
        result: dict[str, Any] = response.json()
        return result

    def list_schedules(self, *, prefix: str = "", state: str | None = None,
                       limit: int | None = None, cursor: str | None = None,
                       ) -> dict[str, Any]:
        """A page of schedules in id order: ``{"schedules", "next_cursor", "as_of_ms"}``
        (``GET /v1/schedules``)."""
        response = self._http.get(f"{self.url}/v1/schedules",
                                  params=_page_params(prefix, state, limit, cursor))
        page = _read(response)
        assert page is not None
        return page

    def get_schedule(self, schedule_id: str) -> dict[str, Any] | None:
        """One schedule with its upcoming fire times, or None if the service holds none
        of that id."""
        return _read(self._http.get(f"{self.url}/v1/schedules/{_path_part(schedule_id)}"),
                     missing_ok=True)

    def get_operation(self, op_id: str) -> dict[str, Any] | None:
        """A pending operation, or one resolved while its id is remembered, or None."""
        return _read(self._http.get(f"{self.url}/v1/operations/{_path_part(op_id)}"),
                     missing_ok=True)

    def wait_applied(self, ts_ms: int, timeout_s: float = 60.0, poll_s: float = 0.05,
                     ) -> None:
        """Return once what the service reads reflects every row up to ``ts_ms`` (an
        :class:`Accepted`'s ``ts_ms``); :class:`SubmitUnavailable` if not in time."""
        deadline = time.monotonic() + timeout_s
        while True:
            as_of = self.list_schedules(limit=1).get("as_of_ms")
            if isinstance(as_of, int) and as_of >= ts_ms:
                return
            if time.monotonic() >= deadline:
                raise SubmitUnavailable(f"{self.url}: rows up to {ts_ms} ms not applied "
                                        f"within {timeout_s} s (as of {as_of})")
            time.sleep(poll_s)

    def wait_ready(self, timeout_s: float = 300.0, poll_s: float = 0.2) -> None:
        """Return once the service's engine runs (the Spark engine takes tens of seconds
        to start, while the API already takes rows); :class:`SubmitUnavailable` if it
        does not within ``timeout_s``."""
        import httpx

        waiting = _Readiness(self.url, timeout_s)
        while True:
            try:
                if waiting.ready(self.status()):
                    return
            except (httpx.HTTPError, ValueError) as exc:
                waiting.failed(exc)
            time.sleep(poll_s)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncClient(_Rows):
    """:class:`Client`'s calls as coroutines, for asyncio code."""

    def __init__(self, url: str, *, timeout_s: float = DEFAULT_TIMEOUT_S,
                 retries: int = DEFAULT_RETRIES, backoff_s: float = 0.05,
                 max_backoff_s: float = 5.0, token: str | None = None,
                 transport: httpx.AsyncBaseTransport | None = None) -> None:
        import httpx

        self.url = url.rstrip("/")
        self._retry = (retries, backoff_s, max_backoff_s)
        self._http = httpx.AsyncClient(timeout=timeout_s, transport=transport,
                                       headers=_auth_headers(token))

    async def submit(self, rows: Mapping[str, Any] | Iterable[Mapping[str, Any]], *,
                     idempotency_key: str | None = None) -> Accepted:
        return await self._send(_request(rows, idempotency_key))

    async def submit_lines(self, lines: Iterable[str], *,
                           idempotency_key: str | None = None) -> Accepted:
        """Rows already written as JSON text, one object a line, sent as they are."""
        return await self._send(_lines_request(lines, idempotency_key))

    async def _send(self, request: tuple[bytes, str, dict[str, str]]) -> Accepted:
        import httpx

        body, key, headers = request
        attempts = _Attempts(*self._retry)
        while True:
            retry_after = None
            try:
                response = await self._http.post(f"{self.url}/v1/events", content=body,
                                                 headers=headers)
            except httpx.TransportError as exc:
                attempts.last = f"{type(exc).__name__}: {exc}"
            else:
                accepted = attempts.outcome(response, key)
                if accepted is not None:
                    return accepted
                retry_after = response.headers.get(RETRY_AFTER)
            delay = attempts.wait_s(retry_after)
            if delay is None:
                raise attempts.unavailable(self.url)
            await asyncio.sleep(delay)

    async def schedule_at(self, op_id: str, when: int | datetime, *,
                          keys: Iterable[str] = (), condition: str = "none",
                          targets: Mapping[str, int] | None = None,
                          min_total: int | None = None, ts_ms: int | None = None,
                          idempotency_key: str | None = None, target: str | None = None,
                          payload: Any = None) -> Accepted:
        return await self.submit(self.watch_row(op_id, when, keys=keys, condition=condition,
                                                targets=targets, min_total=min_total,
                                                ts_ms=ts_ms, target=target, payload=payload),
                                 idempotency_key=idempotency_key)

    async def cancel(self, op_id: str, *, ts_ms: int | None = None,
                     idempotency_key: str | None = None) -> Accepted:
        return await self.submit(self.cancel_row(op_id, ts_ms),
                                 idempotency_key=idempotency_key)

    async def schedule(self, schedule_id: str, schedule: Schedule | Mapping[str, Any], *,
                       ts_ms: int | None = None,
                       idempotency_key: str | None = None, target: str | None = None,
                       payload: Any = None) -> Accepted:
        """Start (or replace) a recurring schedule: each occurrence fires once."""
        return await self.submit(self.schedule_row(schedule_id, schedule, ts_ms=ts_ms,
                                                   target=target, payload=payload),
                                 idempotency_key=idempotency_key)

    async def unschedule(self, schedule_id: str, *, ts_ms: int | None = None,
                         idempotency_key: str | None = None) -> Accepted:
        return await self.submit(self.series_row("unschedule", schedule_id, ts_ms),
                                 idempotency_key=idempotency_key)

    async def pause(self, schedule_id: str, *, ts_ms: int | None = None,
                    idempotency_key: str | None = None) -> Accepted:
        return await self.submit(self.series_row("pause", schedule_id, ts_ms),
                                 idempotency_key=idempotency_key)

    async def resume(self, schedule_id: str, *, ts_ms: int | None = None,
                     idempotency_key: str | None = None) -> Accepted:
        """Occurrences of the pause are decided by the schedule's misfire policy."""
        return await self.submit(self.series_row("resume", schedule_id, ts_ms),
                                 idempotency_key=idempotency_key)

    async def status(self) -> dict[str, Any]:
        response = await self._http.get(f"{self.url}/v1/status")
        response.raise_for_status()
        result: dict[str, Any] = response.json()
        return result

    async def list_schedules(self, *, prefix: str = "", state: str | None = None,
                             limit: int | None = None, cursor: str | None = None,
                             ) -> dict[str, Any]:
        """:meth:`Client.list_schedules`, as a coroutine."""
        response = await self._http.get(f"{self.url}/v1/schedules",
                                        params=_page_params(prefix, state, limit, cursor))
        page = _read(response)
        assert page is not None
        return page

    async def get_schedule(self, schedule_id: str) -> dict[str, Any] | None:
        """:meth:`Client.get_schedule`, as a coroutine."""
        return _read(await self._http.get(
            f"{self.url}/v1/schedules/{_path_part(schedule_id)}"), missing_ok=True)

    async def get_operation(self, op_id: str) -> dict[str, Any] | None:
        """:meth:`Client.get_operation`, as a coroutine."""
        return _read(await self._http.get(f"{self.url}/v1/operations/{_path_part(op_id)}"),
                     missing_ok=True)

    async def wait_ready(self, timeout_s: float = 300.0, poll_s: float = 0.2) -> None:
        """:meth:`Client.wait_ready`, as a coroutine."""
        import httpx

        waiting = _Readiness(self.url, timeout_s)
        while True:
            try:
                if waiting.ready(await self.status()):
                    return
            except (httpx.HTTPError, ValueError) as exc:
                waiting.failed(exc)
            await asyncio.sleep(poll_s)

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
