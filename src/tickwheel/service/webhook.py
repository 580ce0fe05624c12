"""WebhookProcessor: outcomes delivered by HTTP POST to one target, through the batching
dispatcher.

Each batch of outcomes is one JSON POST, ``{"outcomes": [...]}``, each outcome with a
stable ``id`` (:func:`outcome_id`) so that a receiver can drop the duplicates
that at-least-once delivery brings, and the ``target`` and ``payload`` of its watch or
schedule. The answer decides what the dispatcher does, by Eureka's rules for
replication traffic:

- 2xx: delivered.
- 503, 429, or no answer in time: congestion. The dispatcher backs off and its traffic
  shaper slows the sending.
- Any other 5xx, or a connection that fails: a transient error, retried.
- Any other answer (a 4xx, say): a permanent failure. The request and the answer are
  written to the target's dead letters, counted, and never retried.

A target with ``max_attempts`` sends a request that many times at most: the last
failure's answer goes to the dead letters with the request. A target with several urls
spreads its requests over them (``round_robin``) or sends each to the first url that
answers (``failover``: a url that failed to connect or answered 5xx is passed over for
:data:`FAILOVER_PAUSE_S`). A target with a signing key signs every request (see
:mod:`tickwheel.service.signing`); ``webhook-id`` is the same on every attempt of one
request.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from tickwheel.dispatch import ProcessingResult
from tickwheel.pipeline.contract.events import OutcomeKind
from tickwheel.pipeline.io.files import write_bytes_atomically
from tickwheel.pipeline.io.outputs import DEAD_LETTERS
from tickwheel.service.signing import signature_headers
from tickwheel.service.targets import TargetSpec, check_url, target_for_url

if TYPE_CHECKING:
    import httpx

    from tickwheel.pipeline.contract.outcomes import OutcomeRow

__all__ = ["DEAD_LETTER_DIR", "FAILOVER_PAUSE_S", "MAX_ANSWER_BYTES", "WebhookProcessor",
           "WebhookStats", "check_webhook_url", "message_id", "outcome_id",
           "outcomes_body"]

log = logging.getLogger(__name__)

#: Where refused deliveries go, beside the outcomes: a directory per target.
DEAD_LETTER_DIR = DEAD_LETTERS
_CONGESTED = frozenset({429, 503})
#: The most of an answer's body read: what a dead letter keeps of it.
MAX_ANSWER_BYTES: Final = 65_536
#: How long a failover target passes over a url that failed before trying it again.
FAILOVER_PAUSE_S: Final = 30.0

check_webhook_url = check_url


@dataclass(frozen=True, slots=True)
class WebhookStats:
    """Counts of one target's deliveries: requests by what the answer meant, and
    outcomes by what became of them."""

    delivered: int  # outcomes the receiver took (2xx)
    congested: int  # requests answered 503 or 429, or not in time
    transient: int  # requests that failed otherwise (5xx, no connection)
    dead_letters: int  # outcomes written to the dead letters
    #: Outcomes in requests that failed (any answer but 2xx, or none).
    failed: int = 0
    #: Outcomes in failed requests that are tried again.
    retried: int = 0
    #: At the last delivery, how long after its oldest outcome was resolved (wall ms
    #: less ``resolved_ms``; on the event clock, what the rows' times make of it).
    lag_ms: int | None = None


class _Answer:
    __slots__ = ("body", "status", "timed_out", "url")

    def __init__(self, url: str, status: int | None, body: str, *,
                 timed_out: bool = False) -> None:
        self.url = url
        self.status = status  # None: no answer (a timeout, or no connection)
        self.body = body
        self.timed_out = timed_out  # no answer in time: the receiver is slow, not gone


class WebhookProcessor:
    """POSTs batches of outcomes to a target (a :class:`TargetSpec`, or one url);
    answers mapped to the dispatcher's verdicts (see the module). ``dead_letters`` is
    the directory this target's refused requests go to."""

    def __init__(self, target: TargetSpec | str, dead_letters: Path,
                 timeout_s: float | None = None) -> None:
        import httpx

        self.target = target_for_url(target) if isinstance(target, str) else target
        self.url = self.target.urls[0]
        self.dead_letters = dead_letters
        timeout = self.target.timeout_ms / 1000 if timeout_s is None else timeout_s
        self._timeout = httpx.Timeout(timeout)
        self._local = threading.local()  # a client per worker thread
        self._clients: list[httpx.Client] = []
        self._lock = threading.Lock()
        self._counts = {"delivered": 0, "congested": 0, "transient": 0, "dead_letters": 0,
                        "failed": 0, "retried": 0}
        self._lag_ms: int | None = None
        # Failed attempts so far, by outcome id: a request's attempt is its outcomes'
        # most, so a batch the dispatcher forms again differently is still bounded.
        self._attempts: dict[str, int] = {}
        self._next_url = 0
        self._down_until: dict[str, float] = {}

    def _client(self) -> httpx.Client:
        client: httpx.Client | None = getattr(self._local, "client", None)
        if client is None:
            import httpx

            client = httpx.Client(timeout=self._timeout)
            self._local.client = client
            with self._lock:
                self._clients.append(client)
        return client

    def process(self, task: OutcomeRow) -> ProcessingResult:
        return self.process_batch([task])

    def process_batch(self, tasks: list[OutcomeRow]) -> ProcessingResult:
        ids = [outcome_id(row) for row in tasks]
        body = outcomes_body(tasks, ids)
        msg_id = message_id(ids)
        answer = self._send(msg_id, body)
        if answer.status is not None and 200 <= answer.status < 300:
            with self._lock:
                for outcome in ids:
                    self._attempts.pop(outcome, None)
                self._lag_ms = time.time_ns() // 1_000_000 - min(r.resolved_ms for r in tasks)
            return self._count("delivered", ProcessingResult.SUCCESS, len(tasks))
        if answer.status is None or answer.status in _CONGESTED:
            kind = "congested" if answer.status is not None or answer.timed_out \
                else "transient"
            result = (ProcessingResult.CONGESTION if kind == "congested"
                      else ProcessingResult.TRANSIENT_ERROR)
        elif answer.status >= 500:
            kind, result = "transient", ProcessingResult.TRANSIENT_ERROR
        else:
            kind, result = "", ProcessingResult.PERMANENT_ERROR
        with self._lock:
            self._counts["failed"] += len(tasks)
            if kind:
                self._counts[kind] += 1
            attempt = 1 + max((self._attempts.get(i, 0) for i in ids), default=0)
            limit = self.target.max_attempts
            final = result is ProcessingResult.PERMANENT_ERROR or (limit and attempt >= limit)
            if final:
                for outcome in ids:
                    self._attempts.pop(outcome, None)
                self._counts["dead_letters"] += len(tasks)
            else:
                for outcome in ids:
                    self._attempts[outcome] = attempt
                self._counts["retried"] += len(tasks)
        if final:
            self._dead_letter(msg_id, body, answer, attempt)
            return ProcessingResult.PERMANENT_ERROR
        return result

    def send(self, msg_id: str, body: bytes) -> tuple[int | None, str]:
        """One attempt of a request made already (a dead letter's, say): its answer's
        status (None: no answer) and the start of its body."""
        answer = self._send(msg_id, body)
        return answer.status, answer.body

    def _send(self, msg_id: str, body: bytes) -> _Answer:
        """One attempt: a POST to the url the strategy picks (failover: on to the next
        url while one fails to connect or answers 5xx)."""
        import httpx

        urls = self._urls()
        answer = _Answer(urls[0], None, "")
        for url in urls:
            try:
                status, text = self._post(url, msg_id, body)
            except httpx.TimeoutException:
                answer = _Answer(url, None, "timeout", timed_out=True)
            except httpx.TransportError as exc:
                log.info("webhook %s: %s; retried", url, exc)
                answer = _Answer(url, None, f"no connection: {exc}")
            else:
                answer = _Answer(url, status, text)
                if status < 500:
                    if url in self._down_until:
                        with self._lock:
                            self._down_until.pop(url, None)
                    return answer
            if len(urls) > 1:
                with self._lock:
                    self._down_until[url] = time.monotonic() + FAILOVER_PAUSE_S
        return answer

    def _urls(self) -> list[str]:
        """The urls one attempt goes to, in order."""
        urls = self.target.urls
        if len(urls) == 1:
            return [urls[0]]
        with self._lock:
            if self.target.strategy == "round_robin":
                self._next_url = (self._next_url + 1) % len(urls)
                return [urls[self._next_url]]
            now = time.monotonic()
            up = [u for u in urls if self._down_until.get(u, 0.0) <= now]
        return up or list(urls)  # every one failed lately: try them all again

    def _post(self, url: str, msg_id: str, body: bytes) -> tuple[int, str]:
        """The answer's status and at most its first ``MAX_ANSWER_BYTES``: a receiver
        answering a huge body costs that much memory, no more. A connection whose
        answer is left unread is closed, not used again."""
        # identity: the raw bytes read are the answer's, not a compressed bomb's.
        headers = {**self.target.headers, "content-type": "application/json",
                   "accept-encoding": "identity"}
        key = self.target.signing_key
        if key is not None:
            headers.update(signature_headers(key, msg_id, int(time.time()), body))
        with self._client().stream("POST", url, content=body, headers=headers) as answer:
            kept = bytearray()
            for chunk in answer.iter_raw():
                kept += chunk
                if len(kept) >= MAX_ANSWER_BYTES:
                    break
            text = bytes(kept[:MAX_ANSWER_BYTES]).decode("utf-8", "replace")
            return answer.status_code, text

    def _count(self, what: str, result: ProcessingResult, n: int = 1) -> ProcessingResult:
        with self._lock:
            self._counts[what] += n
        return result

    def _dead_letter(self, msg_id: str, body: bytes, answer: _Answer, attempts: int) -> None:
        self.dead_letters.mkdir(parents=True, exist_ok=True)
        name = f"{time.time_ns()}-{threading.get_ident()}.json"
        record = {"target": self.target.name, "url": answer.url, "status": answer.status,
                  "answer": answer.body, "attempts": attempts, "webhook_id": msg_id,
                  "request": json.loads(body)}
        write_bytes_atomically(json.dumps(record, ensure_ascii=False).encode(),
                               self.dead_letters / name)
        log.warning("target %s: a request of %d outcomes failed %d time(s) (last: %s from "
                    "%s): written to %s", self.target.name, len(record["request"]["outcomes"]),
                    attempts, answer.status or answer.body, answer.url,
                    self.dead_letters / name)

    def stats(self) -> WebhookStats:
        with self._lock:
            return WebhookStats(**self._counts, lag_ms=self._lag_ms)

    def close(self) -> None:
        with self._lock:
            clients, self._clients = self._clients, []
        for client in clients:
            client.close()


def message_id(ids: list[str]) -> str:
    """A request's ``webhook-id``: made from its outcomes' ids, so that every attempt
    of it, in this run or after a restart, carries the same one."""
    digest = hashlib.blake2b("\n".join(ids).encode("utf-8", "surrogatepass"),
                             digest_size=16).hexdigest()
    return f"msg_{digest}"


def outcomes_body(rows: list[OutcomeRow], ids: list[str] | None = None) -> bytes:
    """The JSON body of one request: ``{"outcomes": [...]}``. A payload goes in as the
    JSON text it is held as, not decoded and written again."""
    if ids is None:
        ids = [outcome_id(row) for row in rows]
    parts = []
    for row, outcome in zip(rows, ids, strict=True):
        fields = json.dumps(_as_json(row, outcome), ensure_ascii=False)
        parts.append(f'{fields[:-1]}, "payload": {row.payload or "null"}}}')
    return ('{"outcomes": [' + ", ".join(parts) + "]}").encode()


def outcome_id(row: OutcomeRow) -> str:
    """An outcome's id, the same on every delivery: ``op:<op_id>@<registered ms>`` for
    an operation, ``schedule:<schedule_id>@<occurrence ms>`` for an occurrence of a
    schedule. The kind comes first, so an operation and a schedule of one name never
    share an id."""
    if row.outcome is OutcomeKind.FIRED:
        return f"schedule:{row.op_id}"  # its op_id is <schedule_id>@<occurrence ms>
    return f"op:{row.op_id}@{row.resolved_ms - row.latency_ms}"


def _as_json(row: OutcomeRow, outcome: str) -> dict[str, Any]:
    return {"id": outcome, "op_id": row.op_id,
            "outcome": row.outcome.value, "resolved_ms": row.resolved_ms,
            "latency_ms": row.latency_ms, "keys": list(row.keys), "error": row.error,
            "skipped": row.skipped, "target": row.target}
