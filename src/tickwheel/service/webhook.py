"""WebhookProcessor: outcomes delivered by HTTP POST, through the batching dispatcher.

Each batch of outcomes is one JSON POST, ``{"outcomes": [...]}``, each outcome with a
stable ``id`` (:func:`outcome_id`) so that a receiver can drop the duplicates
that at-least-once delivery brings. The answer decides what the dispatcher does, by
Eureka's rules for replication traffic:

- 2xx: delivered.
- 503, 429, or no answer in time: congestion. The dispatcher backs off and its traffic
  shaper slows the sending.
- Any other 5xx, or a connection that fails: a transient error, retried.
- Any other answer (a 4xx, say): a permanent failure. The request and the answer are
  written to ``dead-letter/`` beside the outputs, counted, and never retried.
"""

from __future__ import annotations

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

if TYPE_CHECKING:
    import httpx

    from tickwheel.pipeline.contract.outcomes import OutcomeRow

__all__ = ["DEAD_LETTER_DIR", "MAX_ANSWER_BYTES", "WebhookProcessor", "WebhookStats",
           "check_webhook_url", "outcome_id"]

log = logging.getLogger(__name__)

#: Where refused deliveries go, beside the outcomes.
DEAD_LETTER_DIR = DEAD_LETTERS
_CONGESTED = frozenset({429, 503})
#: The most of an answer's body read: what a dead letter keeps of it.
MAX_ANSWER_BYTES: Final = 65_536


def check_webhook_url(url: str) -> str:
    """``url`` if it is an http(s) URL with a host; ValueError naming what is wrong."""
    import httpx

    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, TypeError) as exc:
        raise ValueError(f"{url!r} is not a URL: {exc}") from None
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise ValueError(f"{url!r} is not an http:// or https:// URL with a host")
    return url


@dataclass(frozen=True, slots=True)
class WebhookStats:
    """Counts of one webhook's requests, by what the answer meant."""

    delivered: int
    congested: int
    transient: int
    dead_letters: int
    #: At the last delivery, how long after its oldest outcome was resolved (wall ms
    #: less ``resolved_ms``; on the event clock, what the rows' times make of it).
    lag_ms: int | None = None


class WebhookProcessor:
    """POSTs batches of outcomes to ``url``; answers mapped to the dispatcher's verdicts
    (see the module). ``dead_letters`` is the directory refused requests go to."""

    def __init__(self, url: str, dead_letters: Path, timeout_s: float = 10.0) -> None:
        import httpx

        self.url = check_webhook_url(url)
        self.dead_letters = dead_letters
        self._timeout = httpx.Timeout(timeout_s)
        self._local = threading.local()  # a client per worker thread
        self._clients: list[httpx.Client] = []
        self._lock = threading.Lock()
        self._counts = {"delivered": 0, "congested": 0, "transient": 0, "dead_letters": 0}
        self._lag_ms: int | None = None

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
        import httpx

        body = json.dumps({"outcomes": [_as_json(row) for row in tasks]},
                          ensure_ascii=False).encode()
        try:
            status, answer = self._post(body)
        except httpx.TimeoutException:
            return self._count("congested", ProcessingResult.CONGESTION)
        except httpx.TransportError as exc:
            log.info("webhook %s: %s; retried", self.url, exc)
            return self._count("transient", ProcessingResult.TRANSIENT_ERROR)
        if 200 <= status < 300:
            self._lag_ms = time.time_ns() // 1_000_000 - min(row.resolved_ms for row in tasks)
            return self._count("delivered", ProcessingResult.SUCCESS, len(tasks))
        if status in _CONGESTED:
            return self._count("congested", ProcessingResult.CONGESTION)
        if status >= 500:
            return self._count("transient", ProcessingResult.TRANSIENT_ERROR)
        self._dead_letter(body, status, answer.decode("utf-8", "replace"))
        return self._count("dead_letters", ProcessingResult.PERMANENT_ERROR, len(tasks))

    def _post(self, body: bytes) -> tuple[int, bytes]:
        """The answer's status and at most its first ``MAX_ANSWER_BYTES``: a receiver
        answering a huge body costs that much memory, no more. A connection whose
        answer is left unread is closed, not used again."""
        # identity: the raw bytes read are the answer's, not a compressed bomb's.
        headers = {"content-type": "application/json", "accept-encoding": "identity"}
        with self._client().stream("POST", self.url, content=body,
                                   headers=headers) as answer:
            kept = bytearray()
            for chunk in answer.iter_raw():
                kept += chunk
                if len(kept) >= MAX_ANSWER_BYTES:
                    break
            return answer.status_code, bytes(kept[:MAX_ANSWER_BYTES])

    def _count(self, what: str, result: ProcessingResult, n: int = 1) -> ProcessingResult:
        with self._lock:
            self._counts[what] += n
        return result

    def _dead_letter(self, body: bytes, status: int, answer: str) -> None:
        self.dead_letters.mkdir(parents=True, exist_ok=True)
        name = f"{time.time_ns()}-{threading.get_ident()}.json"
        record = {"url": self.url, "status": status, "answer": answer,
                  "request": json.loads(body)}
        write_bytes_atomically(json.dumps(record, ensure_ascii=False).encode(),
                               self.dead_letters / name)
        log.warning("webhook %s refused a batch (HTTP %d): written to %s", self.url, status,
                    self.dead_letters / name)

    def stats(self) -> WebhookStats:
        with self._lock:
            return WebhookStats(**self._counts, lag_ms=self._lag_ms)

    def close(self) -> None:
        with self._lock:
            clients, self._clients = self._clients, []
        for client in clients:
            client.close()


def outcome_id(row: OutcomeRow) -> str:
    """An outcome's id, the same on every delivery: ``op:<op_id>@<registered ms>`` for
    an operation, ``schedule:<schedule_id>@<occurrence ms>`` for an occurrence of a
    schedule. The kind comes first, so an operation and a schedule of one name never
    share an id."""
    if row.outcome is OutcomeKind.FIRED:
        return f"schedule:{row.op_id}"  # its op_id is <schedule_id>@<occurrence ms>
    return f"op:{row.op_id}@{row.resolved_ms - row.latency_ms}"


def _as_json(row: OutcomeRow) -> dict[str, Any]:
    return {"id": outcome_id(row), "op_id": row.op_id,
            "outcome": row.outcome.value, "resolved_ms": row.resolved_ms,
            "latency_ms": row.latency_ms, "keys": list(row.keys), "error": row.error,
            "skipped": row.skipped}
