"""Service benchmark: ``tickwheel run --follow --listen`` in a process of its own, fed over
loopback by an open-loop load generator in another, fresh for each phase, delivering to
a webhook receiver in this one.

Each phase starts a fresh service (input, output, checkpoint) and sends requests at a
fixed rate for ``seconds`` (:mod:`benchmarks._load`); a request's latency runs from
when it is due to be sent to its answer, so a server that falls behind is charged for
the wait (no coordinated omission). Phases:

- ``batch``: requests of 100 rows, ``batch_rate`` rows a second;
- ``single``: requests of one row, ``single_rate`` a second;
- ``fire``: "do X in 2 s" rows, ``fire_rate`` a second in requests of 100, with
  ``--lateness-ms 100``: the delay from each deadline to the webhook's receipt of it;
- ``targets``: the ``fire`` load with each row naming one of three targets (``--targets``:
  ``a`` and ``b`` signed, ``c``) and carrying a payload; the fire delay is measured at
  ``a`` and ``b``;
- ``hanging``: the same, with ``c`` a server that takes connections and never answers:
  the fire delay at ``a`` and ``b`` against ``targets``' says whether a target that
  hangs holds up the others.

The anchors, each in a process of its own, under the same ``batch`` and ``single``
loads: a bare aiohttp server that answers 200 without validating or writing anything
(what the HTTP stack alone costs on this machine), and the submit server alone, with no
engine reading what it lands (what a durable acknowledgement costs before any engine).

With ``repeat``, the rounds of every phase and anchor are interleaved and the tables give
the median over the rounds (and the spread of the p99s): one stall of the machine during
a phase, which holds up every request due during it, moves one round's p99, not the
median. The load generator's CPU is in the table too: on a small machine it competes
with the server for the same cores.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import re
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks import child_env
from benchmarks._load import FIRE_IN_MS, TARGETS
from benchmarks._steal import StealSampler

__all__ = ["PHASES", "PhaseResult", "ack_table", "run_service", "service_table",
           "signing_table", "start_service", "targets_table"]

#: The phases whose rows name targets.
_TARGET_PHASES = ("targets", "hanging")
_SECRET = "whsec_" + "dGlja3doZWVsLWJlbmNobWFyay1zZWNyZXQtMzI="

_BARE_SERVER = """
import sys
from aiohttp import web
async def ok(request):
    await request.read()
    return web.json_response({"accepted": 1})
app = web.Application()
app.router.add_post("/v1/events", ok)
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), access_log=None, print=None)
"""
_INTAKE_SERVER = """
import signal, sys, threading
from pathlib import Path
from tickwheel.service.server import SubmitServer
stop = threading.Event()
signal.signal(signal.SIGTERM, lambda *_: stop.set())
work = Path(sys.argv[1])
with SubmitServer(work / "in", work / "state", port=int(sys.argv[2])):
    stop.wait()
"""
#: The anchors' names in the results, by their ``_phase`` argument.
_ANCHORS = {"bare": "bare aiohttp", "intake": "intake alone"}


@dataclass
class PhaseResult:
    engine: str
    phase: str
    rows_per_request: int
    target_rows_s: int
    rows_acked: int = 0
    seconds: float = 0.0
    errors: int = 0
    overloaded: int = 0  # requests not sent: too many in flight
    latency_ms: list[float] = field(default_factory=list)
    fire_delay_ms: list[float] = field(default_factory=list)
    intake: dict[str, Any] = field(default_factory=dict)  # /v1/status's, after the load
    load_cpu_s: float = 0.0  # the load generator's CPU time, user and system
    #: The share of the machine's CPU its hypervisor took during the load (None: not
    #: measured, not Linux).
    stolen: float | None = None

    @property
    def rows_s(self) -> float:
        return self.rows_acked / self.seconds if self.seconds else 0.0


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class _Receiver:
    """A webhook receiver on loopback: when each expiry arrived, less its deadline."""

    def __init__(self) -> None:
        self.delays: list[float] = []
        self.seen: set[str] = set()
        self.url = ""
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()
        self._ready.wait()

    def _run(self) -> None:
        asyncio.run(self._main())

    async def _main(self) -> None:
        from aiohttp import web

        async def hook(request: web.Request) -> web.Response:
            now = time.time_ns() / 1e6
            for outcome in json.loads(await request.read())["outcomes"]:
                if outcome["outcome"] == "expired" and outcome["id"] not in self.seen:
                    self.seen.add(outcome["id"])
                    self.delays.append(now - outcome["resolved_ms"])
            return web.Response(text="ok")

        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        app = web.Application(client_max_size=64 << 20)
        app.router.add_post("/hook", hook)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{runner.addresses[0][1]}/hook"
        self._ready.set()
        await self._stop.wait()
        await runner.cleanup()

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout=30)


class _Hanging:
    """A server on loopback that takes connections and never answers."""

    def __init__(self) -> None:
        import socket

        self._listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}/hook"
        self._held: list[Any] = []
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        try:
            while True:
                connection, _ = self._listener.accept()
                self._held.append(connection)  # read nothing, answer nothing
        except OSError:  # closed
            pass

    def stop(self) -> None:
        self._listener.close()
        for connection in self._held:
            connection.close()


def _targets_file(work: Path, urls: list[str]) -> Path:
    """Three targets, the first two signed."""
    (work / "bench.key").write_text(_SECRET)
    text = ""
    for name, url in zip(TARGETS, urls, strict=True):
        signed = 'secret_file = "bench.key"\n' if name != TARGETS[-1] else ""
        text += f'[targets.{name}]\nurls = ["{url}"]\n{signed}'
    path = work / "targets.toml"
    path.write_text(text)
    return path


def start_service(engine: str, work: Path, webhook: str, master: str = "local[2]",
                  targets: Path | None = None) -> tuple[subprocess.Popen[str], str]:
    """``tickwheel run --follow --clock wall --listen`` on ``work/in`` as a user starts
    it, delivering to ``webhook`` (or to ``targets``, a targets file); the process and
    its API's URL once it follows."""
    delivery = ["--deliver-to", webhook] if targets is None else ["--targets", str(targets)]
    args = [sys.executable, "-m", "tickwheel.cli", "run", "--follow", "--clock", "wall",
            "--lateness-ms", "100", "--trigger-ms", "100", "--input", str(work / "in"),
            "--output", str(work / "out"), "--listen", "127.0.0.1:0", *delivery,
            "--engine", engine]
    if engine == "spark":
        args += ["--master", master]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    child = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True, env=env)
    assert child.stdout is not None
    url = ""
    for line in child.stdout:
        found = re.search(r"taking rows at (http://\S+)/v1/events", line)
        if found:
            url = found.group(1)
        if line.startswith("following"):
            break
    if not url:
        child.kill()
        raise RuntimeError(f"the {engine} service did not start: {child.communicate()[0]}")
    # Drain its output, or a full pipe would stop it.
    threading.Thread(target=lambda: [None for _ in child.stdout or ()], daemon=True).start()
    return child, url


def _start_anchor(anchor: str, work: Path) -> tuple[subprocess.Popen[str], str]:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    args = ([_BARE_SERVER, str(port)] if anchor == "bare"
            else [_INTAKE_SERVER, str(work), str(port)])
    child = subprocess.Popen([sys.executable, "-c", *args], text=True)
    url = f"http://127.0.0.1:{port}"
    _wait_for(url)
    return child, url


def _stop_service(child: subprocess.Popen[str]) -> None:
    child.send_signal(signal.SIGTERM)
    try:
        child.wait(timeout=120)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()


def _load_elsewhere(url: str, result: PhaseResult, seconds: float, fire: bool | str,
                    scratch: Path, client: str) -> None:
    """:func:`~benchmarks._load.run_load` in a process of its own, fresh for each
    phase: no phase is measured with the heap, the sockets or the CPU of the one before
    it."""
    out = scratch / "load.json"
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([sys.executable, "-m", "benchmarks._load", url, result.phase,
                    str(result.rows_per_request), str(result.target_rows_s), str(seconds),
                    fire if isinstance(fire, str) else "fire" if fire else "ack", client,
                    str(out)], check=True,
                   env=child_env())
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    result.load_cpu_s = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    loaded = json.loads(out.read_text())
    result.rows_acked, result.seconds = loaded["rows_acked"], loaded["seconds"]
    result.errors, result.overloaded = loaded["errors"], loaded["overloaded"]
    result.latency_ms = loaded["latency_ms"]


def _phase(engine: str, phase: str, rows_per_request: int, rows_s: int, seconds: float,
           master: str, anchor: str | None = None, client: str = "h11") -> PhaseResult:
    """One phase against a fresh service of ``engine``, or against an anchor
    (``bare`` or ``intake``, see the module doc)."""
    name = engine if anchor is None else _ANCHORS[anchor]
    result = PhaseResult(name, phase, rows_per_request, rows_s)
    receiver = _Receiver()
    receiver.start()
    # The targets phases: a and b measured, c answering (targets) or hanging.
    measured = [receiver]
    others: list[_Receiver | _Hanging] = []
    if phase in _TARGET_PHASES:
        second = _Receiver()
        second.start()
        measured.append(second)
        if phase == "targets":
            third = _Receiver()
            third.start()
            others.append(third)
        else:
            others.append(_Hanging())
    with tempfile.TemporaryDirectory(prefix="tickwheel-bench-service-") as tmp:
        work = Path(tmp)
        (work / "in").mkdir()
        targets = None if phase not in _TARGET_PHASES else _targets_file(
            work, [*(r.url for r in measured), others[0].url])
        if anchor is None:
            child, url = start_service(engine, work, receiver.url, master, targets)
        else:
            child, url = _start_anchor(anchor, work)
        try:
            mode: bool | str = "targets" if targets is not None else phase == "fire"
            steal = StealSampler().start()
            try:
                _load_elsewhere(url, result, seconds, fire=mode, scratch=work, client=client)
            finally:
                steal.stop()
            result.stolen = steal.share()
            if anchor != "bare":
                result.intake = _intake_status(url)
            if phase == "fire" or targets is not None:  # the last deadlines and delivery
                share = sum(1 for i in range(rows_per_request)
                            if targets is None or i % len(TARGETS) < len(measured))
                expected = result.rows_acked // rows_per_request * share
                deadline = time.monotonic() + FIRE_IN_MS / 1000 + 30
                while (sum(len(r.seen) for r in measured) < expected
                       and time.monotonic() < deadline):
                    time.sleep(0.1)
                result.fire_delay_ms = [d for r in measured for d in r.delays]
        finally:
            _stop_service(child)
            for server in (*measured, *others):
                server.stop()
    # What the phase wrote (hundreds of MB at 20,000 rows a second) on disk before the
    # next starts, so that its write-back does not overlap the next phase's fsyncs.
    os.sync()
    return result


def _intake_status(url: str) -> dict[str, Any]:
    import urllib.request

    with urllib.request.urlopen(f"{url}/v1/status", timeout=30) as answer:
        intake: dict[str, Any] = json.loads(answer.read())["intake"]
    return intake


def _wait_for(url: str) -> None:
    import urllib.error
    import urllib.request

    for _ in range(200):
        try:
            urllib.request.urlopen(f"{url}/v1/events", timeout=1)
        except urllib.error.HTTPError:
            return  # it answers (405 for a GET)
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"{url} did not come up")


PHASES = ("batch", "single", "fire", *_TARGET_PHASES)


def run_service(engines: list[str], seconds: float, batch_rate: int, single_rate: int,
                fire_rate: int, master: str = "local[2]",
                phases: tuple[str, ...] = PHASES, repeat: int = 1,
                client: str = "h11") -> list[PhaseResult]:
    """Every phase against each anchor and engine, ``repeat`` rounds, interleaved."""
    loads = [(phase, per_request, rate) for phase, per_request, rate in (
        ("batch", 100, batch_rate), ("single", 1, single_rate), ("fire", 100, fire_rate),
        ("targets", 100, fire_rate), ("hanging", 100, fire_rate))
        if phase in phases]
    results: list[PhaseResult] = []
    for round_number in range(1, repeat + 1):
        for anchor in _ANCHORS:
            for phase, per_request, rate in loads:
                if phase in ("batch", "single"):
                    results.append(_phase("", phase, per_request, rate, seconds, master,
                                          anchor=anchor, client=client))
        for engine in engines:
            for phase, per_request, rate in loads:
                print(f"{engine}: {phase} at {rate:,} rows/s for {seconds:.0f} s (round "
                      f"{round_number} of {repeat})", flush=True)
                results.append(_phase(engine, phase, per_request, rate, seconds, master,
                                      client=client))
    return results


def _rounds(results: list[PhaseResult]) -> list[list[PhaseResult]]:
    """The results of each (engine, phase), in the order they first ran."""
    grouped: dict[tuple[str, str], list[PhaseResult]] = {}
    for r in results:
        grouped.setdefault((r.engine, r.phase), []).append(r)
    return list(grouped.values())


def _median(values: list[float]) -> float:
    """The median of ``values``, leaving out NaN (a run with nothing measured)."""
    measured = [value for value in values if not math.isnan(value)]
    return statistics.median(measured) if measured else math.nan


def _median_of(runs: list[PhaseResult], measure: Callable[[PhaseResult], float]) -> float:
    return _median([measure(run) for run in runs])


def service_table(results: list[PhaseResult]) -> str:
    """A row per (engine, phase): medians over its rounds, and the p99s' spread."""
    groups = _rounds(results)
    anchors = {runs[0].phase: runs for runs in groups if runs[0].engine == "bare aiohttp"}
    lines = ["| engine | phase | target rows/s | acked rows/s | ack p50 ms | ack p99 ms | "
             "p99 of each round | errors | load generator CPU | fire delay p50 ms | "
             "fire delay p99 ms | CPU stolen in each round |",
             "|---|---|---:|---:|---:|---:|---|---:|---:|---:|---:|---|"]
    for runs in groups:
        r = runs[0]
        p99s = [_percentile(run.latency_ms, 0.99) for run in runs]
        p99 = _median(p99s)
        anchor = anchors.get(r.phase)
        ratio = ""
        if anchor is not None and anchor is not runs:
            base = _median_of(anchor, lambda run: _percentile(run.latency_ms, 0.99))
            if base > 0:  # NaN or 0: no ratio
                ratio = f" ({p99 / base:.1f}x)"
        fire = "- | -"
        if any(run.fire_delay_ms for run in runs):
            fire = (f"{_median_of(runs, lambda run: _percentile(run.fire_delay_ms, 0.5)):,.0f}"
                    f" | {_median_of(runs, lambda run: _percentile(run.fire_delay_ms, 0.99)):,.0f}")
        cpu = _median_of(runs, lambda run: run.load_cpu_s / run.seconds if run.seconds
                         else math.nan)
        lines.append(
            f"| {r.engine} | {r.phase} ({r.rows_per_request}/request) | {r.target_rows_s:,} | "
            f"{_median_of(runs, lambda run: run.rows_s):,.0f} | "
            f"{_median_of(runs, lambda run: _percentile(run.latency_ms, 0.5)):,.1f} | "
            f"{p99:,.1f}{ratio} | {', '.join(f'{v:,.1f}' for v in p99s)} | "
            f"{sum(run.errors + run.overloaded for run in runs):,} | {cpu:.0%} of a core | "
            f"{fire} | {_stolen_cell(runs)} |")
    return "\n".join(lines)


def _stolen_cell(runs: list[PhaseResult]) -> str:
    """Each round's share of the CPU the hypervisor took: a round on a busy host has a
    tail of its own."""
    return ", ".join("-" if run.stolen is None else f"{run.stolen:.1%}" for run in runs)


def _histogram_cell(runs: list[PhaseResult], name: str) -> str:
    """The median over ``runs`` of one /v1/status histogram's mean and p99 bound."""
    mean = _median_of(runs, lambda run: float(run.intake[name]["mean"]))
    p99 = _median_of(runs, lambda run: float(run.intake[name]["p99"]))
    return f"{mean:.1f} ({p99:g})"


def ack_table(results: list[PhaseResult]) -> str:
    """Where a request's time went, as the service measured it (its /v1/status
    histograms: means, and the upper bound of the bucket that holds the p99), the
    median over the rounds."""
    lines = ["| engine | phase | commits/s | requests/commit | ack mean ms (p99 within) | "
             "commit wait mean ms (p99 within) | commit land mean ms (p99 within) |",
             "|---|---|---:|---:|---:|---:|---:|"]
    for rounds in _rounds(results):
        runs = [run for run in rounds if run.intake]
        if not runs:
            continue
        r = runs[0]
        commits = _median_of(runs, lambda run: run.intake["land_ms"]["count"] / run.seconds
                             if run.seconds else math.nan)
        per_commit = _median_of(runs, lambda run: run.intake["ack_ms"]["count"]
                                / run.intake["land_ms"]["count"]
                                if run.intake["land_ms"]["count"] else math.nan)
        lines.append(
            f"| {r.engine} | {r.phase} ({r.rows_per_request}/request) | {commits:,.0f} | "
            f"{per_commit:,.1f} | {_histogram_cell(runs, 'ack_ms')} | "
            f"{_histogram_cell(runs, 'commit_wait_ms')} | {_histogram_cell(runs, 'land_ms')} |")
    return "\n".join(lines)


def targets_table(results: list[PhaseResult]) -> str:
    """The fire delay at the two targets that answer, with the third answering and
    with it hanging, and their ratio: medians over the rounds."""
    lines = ["| engine | third target | fire delay p50 ms | fire delay p99 ms | p99 ratio |",
             "|---|---|---:|---:|---:|"]
    groups = {(runs[0].engine, runs[0].phase): runs for runs in _rounds(results)}
    for (engine, phase), runs in groups.items():
        if phase not in _TARGET_PHASES:
            continue
        p99 = _median_of(runs, lambda run: _percentile(run.fire_delay_ms, 0.99))
        calm = groups.get((engine, "targets"))
        ratio = "1.00x (anchor)" if phase == "targets" else "-"
        if phase == "hanging" and calm is not None:
            base = _median_of(calm, lambda run: _percentile(run.fire_delay_ms, 0.99))
            ratio = f"{p99 / base:.2f}x" if base > 0 else "-"
        lines.append(
            f"| {engine} | {'answers' if phase == 'targets' else 'hangs'} | "
            f"{_median_of(runs, lambda run: _percentile(run.fire_delay_ms, 0.5)):,.0f} | "
            f"{p99:,.0f} | {ratio} |")
    return "\n".join(lines)


def signing_table(batch: int = 250, repeat: int = 7) -> str:
    """What a request of ``batch`` outcomes costs to build, unsigned and signed (the
    Standard Webhooks HMAC over its body), in this process: medians of ``repeat``."""
    from tickwheel.pipeline.contract.events import OutcomeKind
    from tickwheel.pipeline.contract.outcomes import OutcomeRow
    from tickwheel.service.signing import SigningKey, signature_headers
    from tickwheel.service.webhook import message_id, outcome_id, outcomes_body

    rows = [OutcomeRow(f"order-{i}", OutcomeKind.EXPIRED, 1_700_000_000_000 + i, 2_000, (),
                       None, target="a", payload=json.dumps({"order": i, "note": "x" * 40}))
            for i in range(batch)]
    key = SigningKey(_SECRET)
    n = 200

    def unsigned() -> None:
        ids = [outcome_id(row) for row in rows]
        outcomes_body(rows, ids)

    def signed() -> None:
        ids = [outcome_id(row) for row in rows]
        body = outcomes_body(rows, ids)
        signature_headers(key, message_id(ids), int(time.time()), body)

    def per_request_us(call: Callable[[], None]) -> float:
        started = time.perf_counter()
        for _ in range(n):
            call()
        return (time.perf_counter() - started) / n * 1e6

    plain = statistics.median(per_request_us(unsigned) for _ in range(repeat))
    with_key = statistics.median(per_request_us(signed) for _ in range(repeat))
    return ("| request of | body, unsigned | body, signed | signing costs | ratio |\n"
            "|---|---:|---:|---:|---:|\n"
            f"| {batch} outcomes | {plain:,.0f} us | {with_key:,.0f} us | "
            f"{with_key - plain:,.0f} us | {with_key / plain:.2f}x |")
