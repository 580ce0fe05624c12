"""The read side's benchmark: what the local service's view of its schedules costs in
memory, and how fast a page of them answers while rows are submitted.

- memory: one view holding N schedules (daily crons over 1,440 distinct specs, in a few
  zones), measured with ``tracemalloc``; the anchor is the same entries held in a plain
  ``dict`` (what any index must at least keep);
- latency: ``tickwheel run --follow --clock wall --listen`` given N schedules through its
  API (5,000 rows a request), delivering to a receiver in a process of its own; once its
  view holds them all, single-row requests are submitted at ``--submit-rate`` by the load
  generator in another process, while this process reads
  a page of 100 schedules from a random place (``GET /v1/schedules?limit=100&cursor=``)
  and, as the anchor, ``GET /v1/status``, each ``--read-rate`` times a second;
- the machine: the CPU a hypervisor took meanwhile (:mod:`benchmarks._steal`), over the
  run and while each read ran, so that a run on a busy host says so.
"""

from __future__ import annotations

import base64
import json
import random
import subprocess
import sys
import tempfile
import threading
import time
import tracemalloc
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from benchmarks import child_env
from benchmarks._steal import StealSampler

__all__ = ["ReadResult", "read_table", "run_reads", "view_bytes"]

_ZONES: Final = ("UTC", "Europe/London", "America/New_York", "Asia/Shanghai")
_ROWS_PER_REQUEST: Final = 5_000
#: A read during which the hypervisor took more than this share of the CPU ran on a
#: busy host (measured over the 0.1 s samples around it).
STOLEN_OVER: Final = 0.10


def _spec(n: int) -> dict[str, Any]:
    return {"cron": f"{n % 60} {(n // 60) % 24} * * *", "tz": _ZONES[n % len(_ZONES)]}


def _id(n: int) -> str:
    return f"sched-{n:08d}"


def view_bytes(n: int) -> tuple[float, float]:
    """Bytes per schedule: the view's, and the plain dict's (the anchor)."""
    from tickwheel.pipeline.semantics.partition import CommittedChanges
    from tickwheel.pipeline.semantics.schedule_book import (
        SCHEDULE_ENTRY,
        SCHEDULE_KEY,
        SeriesEntry,
    )
    from tickwheel.service.view import StateView

    def entries() -> list[tuple[str, Any]]:
        return [(SCHEDULE_KEY + _id(i), SeriesEntry(
            SCHEDULE_ENTRY, _id(i), _spec(i % 1_440), after_ms=0,
            next_ms=86_400_000 + i % 1_440 * 60_000, runs=0, skipped=0, paused=False,
            target=None, payload=None)) for i in range(n)]

    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        batch = entries()  # what the engine hands over, let go of once taken
        view = StateView()
        view.apply(CommittedChanges(1, batch, [], [], 1))
        del batch
        view_total = tracemalloc.get_traced_memory()[0] - before
        before = tracemalloc.get_traced_memory()[0]
        plain = {_id(i): (i % 1_440, 86_400_000 + i % 1_440 * 60_000, 0, 0, False, None,
                          None, None) for i in range(n)}
        plain_total = tracemalloc.get_traced_memory()[0] - before
        assert len(plain) == view.stats().schedules == n
    finally:
        tracemalloc.stop()
    return view_total / n, plain_total / n


@dataclass
class ReadResult:
    schedules: int
    submit_rate: int
    seconds: float
    page_ms: list[float] = field(default_factory=list)
    page_at: list[float] = field(default_factory=list)  # wall time each page was read
    status_ms: list[float] = field(default_factory=list)
    status_at: list[float] = field(default_factory=list)
    #: The share of the CPU stolen during the reads, and while each read ran (None:
    #: not measured, not Linux).
    stolen: float | None = None
    page_stolen: list[float | None] = field(default_factory=list)
    status_stolen: list[float | None] = field(default_factory=list)
    minute_stolen: list[float | None] = field(default_factory=list)  # each whole minute's
    errors: int = 0
    rows_acked: int = 0
    load_seconds: float = 0.0
    view_bytes: float = 0.0
    dict_bytes: float = 0.0
    ingest_s: float = 0.0


def _seed(url: str, n: int) -> None:
    """``n`` schedules through the API, as clients would send them (each row stamped
    on arrival, so none is late however long the engine takes to read them)."""
    from tickwheel.client import Client

    with Client(url, timeout_s=60) as client:
        for start in range(0, n, _ROWS_PER_REQUEST):
            client.submit_lines(json.dumps({"type": "schedule", "schedule_id": _id(i),
                                            **_spec(i)})
                                for i in range(start, min(n, start + _ROWS_PER_REQUEST)))


def _held(url: str) -> int:
    import httpx

    state = httpx.get(f"{url}/v1/status", timeout=30).json().get("state") or {}
    return int(state.get("schedules", 0))


def _reader(url: str, n: int, rate: int, stop: threading.Event, result: ReadResult) -> None:
    import httpx

    pick = random.Random(7)
    with httpx.Client(timeout=30) as client:
        due = time.perf_counter()
        while not stop.is_set():
            due += 1 / rate
            start = max(due, time.perf_counter())
            time.sleep(max(0.0, due - time.perf_counter()))
            after = base64.urlsafe_b64encode(_id(pick.randrange(n)).encode()).decode().rstrip("=")
            for path, into in ((f"/v1/schedules?limit=100&cursor={after}", result.page_ms),
                               ("/v1/status", result.status_ms)):
                started = time.perf_counter()
                try:
                    answer = client.get(f"{url}{path}")
                    answer.read()
                    ok = answer.status_code == 200
                except httpx.HTTPError:
                    ok = False
                # From when it was due: a reader held up is charged for the wait.
                into.append((time.perf_counter() - min(started, start)) * 1000)
                (result.page_at if into is result.page_ms else result.status_at).append(
                    time.time())
                result.errors += not ok


def run_reads(n: int, seconds: float, submit_rate: int, read_rate: int) -> ReadResult:
    from benchmarks._service import _stop_service, start_service

    result = ReadResult(n, submit_rate, seconds)
    result.view_bytes, result.dict_bytes = view_bytes(n)
    # In its own process: a burst of fires it takes is not charged to the reader.
    receiver = subprocess.Popen([sys.executable, "-m", "benchmarks._receiver"],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                env=child_env())
    assert receiver.stdout is not None and receiver.stdin is not None
    receiver_url = receiver.stdout.readline().strip()
    with tempfile.TemporaryDirectory(prefix="tickwheel-bench-reads-") as tmp:
        work = Path(tmp)
        (work / "in").mkdir()
        started = time.monotonic()
        child, url = start_service("local", work, receiver_url)
        try:
            _seed(url, n)
            while _held(url) < n:
                if time.monotonic() - started > 1_800:
                    raise RuntimeError("the service took over 30 minutes to take the input")
                time.sleep(1)
            result.ingest_s = time.monotonic() - started
            print(f"the view holds {n:,} schedules after {result.ingest_s:.0f} s", flush=True)
            stop = threading.Event()
            steal = StealSampler().start()
            reader = threading.Thread(target=_reader, args=(url, n, read_rate, stop, result))
            reader.start()
            out = work / "load.json"
            try:
                subprocess.run([sys.executable, "-m", "benchmarks._load", url, "single",
                                "1", str(submit_rate), str(seconds), "ack", "h11", str(out)],
                               check=True, env=child_env())
            finally:
                stop.set()
                reader.join()
                steal.stop()
            _charge_steal(result, steal)
            loaded = json.loads(out.read_text())
            result.rows_acked, result.load_seconds = loaded["rows_acked"], loaded["seconds"]
            result.errors += loaded["errors"]
        finally:
            _stop_service(child)
            receiver.stdin.close()
            receiver.wait(timeout=30)
    return result


def _charge_steal(result: ReadResult, steal: StealSampler) -> None:
    result.stolen = steal.share()
    for ms_list, at_list, into in ((result.page_ms, result.page_at, result.page_stolen),
                                   (result.status_ms, result.status_at,
                                    result.status_stolen)):
        into[:] = [steal.share(at - ms / 1000, at) for ms, at in
                   zip(ms_list, at_list, strict=True)]
    if result.page_at:
        first = result.page_at[0]
        result.minute_stolen = [steal.share(first + 60 * k, first + 60 * (k + 1))
                                for k in range(int(result.seconds // 60))]


def _calm(values: list[float], stolen: list[float | None]) -> list[float]:
    """The reads during which the hypervisor took at most :data:`STOLEN_OVER`."""
    return [ms for ms, share in zip(values, stolen, strict=True)
            if share is None or share <= STOLEN_OVER]


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def _slowest(result: ReadResult) -> str:
    stolen = result.page_stolen or [None] * len(result.page_ms)
    worst = sorted(zip(result.page_ms, result.page_at, stolen, strict=True),
                   key=lambda read: read[0], reverse=True)[:12]
    return ", ".join(f"{ms:.0f} ms at :{at % 60:04.1f}"
                     + ("" if share is None else f" ({share:.0%} stolen)")
                     for ms, at, share in worst)


def _steal_lines(result: ReadResult) -> list[str]:
    if result.stolen is None:
        return ["the CPU the hypervisor took was not measured (no /proc/stat)."]
    pages = _calm(result.page_ms, result.page_stolen)
    statuses = _calm(result.status_ms, result.status_stolen)
    page99, status99 = _quantile(pages, 0.99), _quantile(statuses, 0.99)
    return [f"the hypervisor took {result.stolen:.1%} of the machine's CPU during the reads "
            f"(steal); {len(result.page_ms) - len(pages):,} pages ran while it took over "
            f"{STOLEN_OVER:.0%}. Without those reads: page p99 {page99:.1f} ms, status p99 "
            f"{status99:.1f} ms ({page99 / status99:.2f}x)."]


def _by_minute(result: ReadResult) -> str:
    """Each whole minute's page p99, and the CPU stolen in it: how much a window's p99
    depends on where it falls."""
    if not result.page_at:
        return ""
    first = result.page_at[0]
    minutes: dict[int, list[float]] = {}
    for ms, at in zip(result.page_ms, result.page_at, strict=False):
        minutes.setdefault(int((at - first) // 60), []).append(ms)
    whole = [values for _, values in sorted(minutes.items())][: int(result.seconds // 60)]
    stolen = result.minute_stolen
    return ", ".join(f"{_quantile(values, 0.99):.0f}"
                     + ("" if k >= len(stolen) or stolen[k] is None
                        else f" ({stolen[k]:.1%} stolen)")
                     for k, values in enumerate(whole))


def read_table(result: ReadResult) -> str:
    page50, page99 = _quantile(result.page_ms, 0.5), _quantile(result.page_ms, 0.99)
    status50, status99 = _quantile(result.status_ms, 0.5), _quantile(result.status_ms, 0.99)
    acked = result.rows_acked / result.load_seconds if result.load_seconds else 0.0
    return "\n".join([
        f"| read, at {result.schedules:,} schedules, {acked:,.0f} rows/s submitted "
        "| median ms | p99 ms | p99 / anchor's |",
        "|---|---|---|---|",
        f"| `GET /v1/status` (anchor) | {status50:.1f} | {status99:.1f} | 1.00x |",
        f"| `GET /v1/schedules?limit=100&cursor=...` | {page50:.1f} | {page99:.1f} | "
        f"{page99 / status99:.2f}x |",
        "",
        f"the slowest pages at seconds past the minute: {_slowest(result)}",
        f"page p99 ms in each minute of the run: {_by_minute(result) or '-'}",
        *_steal_lines(result),
        "",
        f"{len(result.page_ms):,} pages read, {result.errors} errors; the view took "
        f"{result.ingest_s:.0f} s to hold every schedule from the start.",
        "",
        "| memory per schedule | bytes | / anchor's |",
        "|---|---|---|",
        f"| a plain dict of id to an 8-tuple (anchor) | {result.dict_bytes:.0f} | 1.00x |",
        f"| the read view (sorted index, spec shared) | {result.view_bytes:.0f} | "
        f"{result.view_bytes / result.dict_bytes:.2f}x |",
    ])
