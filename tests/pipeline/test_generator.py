"""The workload generator: broker models in, a valid event log out."""

from __future__ import annotations

import itertools
import json
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from tests.conftest import eventually
from tickwheel.pipeline.contract.events import OutcomeKind
from tickwheel.pipeline.engines.reference import ReferenceEngine
from tickwheel.pipeline.tools.generator import GeneratorConfig, generate, iter_rows, write_event_log


def resolve(directory: Path) -> ReferenceEngine:
    engine = ReferenceEngine()
    for f in sorted(directory.glob("*.jsonl")):
        engine.feed_lines(f.read_text().splitlines())
    return engine


def test_the_same_seed_gives_the_same_log() -> None:
    assert generate(GeneratorConfig(events=3_000, seed=5)) == generate(
        GeneratorConfig(events=3_000, seed=5))
    assert generate(GeneratorConfig(events=3_000, seed=5)) != generate(
        GeneratorConfig(events=3_000, seed=6))


def test_a_workload_has_every_kind_of_operation_and_outcome(tmp_path: Path) -> None:
    stats = write_event_log(GeneratorConfig(events=40_000, rows_per_file=7_000), tmp_path)
    assert stats == {"rows": 40_000, "malformed": 0, "files": 6}
    result = resolve(tmp_path).run()
    assert not result.quarantine
    kinds = Counter((o.op_id.rsplit("-", 1)[0], o.outcome) for o in result.outcomes)
    for kind in ("produce", "fetch", "follower-fetch", "session"):
        assert kinds[kind, OutcomeKind.COMPLETED] > 0, kind
        assert kinds[kind, OutcomeKind.EXPIRED] > 0, kind
    assert kinds["task", OutcomeKind.CANCELLED] > 0 and kinds["task", OutcomeKind.EXPIRED] > 0
    assert kinds["produce", OutcomeKind.ERROR] > 0


def test_malformed_rows_and_bounded_disorder_lose_nothing(tmp_path: Path) -> None:
    config = GeneratorConfig(events=20_000, malformed_fraction=0.02, disorder_ms=3_000)
    stats = write_event_log(config, tmp_path)
    result = resolve(tmp_path).run()
    assert result.rows_in == stats["rows"] == result.rows_applied + len(result.quarantine)
    assert len(result.quarantine) == stats["malformed"] == 400
    # Disorder within the lateness bound changes no outcome.
    ordered = tmp_path / "ordered"
    write_event_log(GeneratorConfig(events=20_000), ordered)
    assert sorted(resolve(ordered).run().outcomes, key=lambda o: o.op_id) == sorted(
        result.outcomes, key=lambda o: o.op_id)


def test_rows_stream_however_many_events_are_asked_for() -> None:
    # A log of 2^63 rows starts at once, as the models make it: nothing is built whole.
    head = list(itertools.islice(iter_rows(GeneratorConfig(events=2**63)), 2_000))
    assert head == generate(GeneratorConfig(events=2_000))


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupted_run_leaves_whole_files_only(tmp_path: Path,
                                                    signum: signal.Signals) -> None:
    # Either signal stops it after the file being written: a shell's background job,
    # which inherits SIGINT ignored, stops too.
    out = tmp_path / "log"
    command = [sys.executable, "-m", "tickwheel.cli", "generate", "--events", str(2**63),
               "--rows-per-file", "2000", "--output", str(out)]
    child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True)
    assert eventually(lambda: len(list(out.glob("events-*.jsonl"))) >= 2, 120)
    child.send_signal(signum)
    output, _ = child.communicate(timeout=60)
    assert child.returncode == 130, output
    assert "whole files" in output
    files = sorted(out.iterdir())
    assert len(files) >= 2 and all(f.name.startswith("events-") for f in files)  # no .tmp
    for f in files:
        lines = f.read_text().split("\n")
        assert lines[-1] == "" and len(lines) == 2_001
        assert all(json.loads(line)["ts_ms"] > 0 for line in lines[:-1])


def test_bad_sizes_are_rejected() -> None:
    with pytest.raises(ValueError, match="events"):
        generate(GeneratorConfig(events=0))


def test_the_log_does_not_depend_on_the_hash_seed() -> None:
    import os
    import subprocess
    import sys

    code = ("import hashlib, json; from tickwheel.pipeline.tools.generator import generate, "
            "GeneratorConfig; print(hashlib.sha1(json.dumps(generate(GeneratorConfig("
            "events=4_000))).encode()).hexdigest())")
    digests = {
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       check=True, env={**os.environ, "PYTHONHASHSEED": seed}).stdout
        for seed in ("1", "2")
    }
    assert len(digests) == 1


# -- a live workload ---------------------------------------------------------------------


def test_a_live_workload_lands_whole_files_of_rows_whose_time_has_passed(
        tmp_path: Path) -> None:
    import threading

    from tickwheel.pipeline.tools.generator import _MALFORMED_SET, follow_event_log

    out = tmp_path / "live"
    stop = threading.Event()
    landed: list[tuple[int, int]] = []
    started_ms = time.time_ns() // 1_000_000
    writer = threading.Thread(target=lambda: follow_event_log(
        GeneratorConfig(seed=5, malformed_fraction=0.01), out, 2_000, stop, file_ms=200,
        on_file=lambda rows, behind: landed.append((rows, time.time_ns() // 1_000_000))))
    writer.start()
    time.sleep(2.0)
    stop.set()
    writer.join(timeout=60)
    assert not writer.is_alive()
    files = sorted(out.iterdir())
    assert len(files) >= 5 and all(f.name.startswith("events-") for f in files)  # no .tmp
    rows = 0
    for f in files:
        first_ms = int(f.stem.split("-")[1])
        mtime_ms = f.stat().st_mtime_ns // 1_000_000
        for line in f.read_text().splitlines():
            if line in _MALFORMED_SET:
                continue
            row = json.loads(line)
            rows += 1
            # In its file's window, which had passed when the file was written. A
            # model's row may come 1 ms before the one it follows (a session's watch is
            # 1 ms after its clock), so a file's first row may be 1 ms before its window.
            # The mtime comes from the kernel's coarse clock, up to a tick (4 ms) behind.
            assert first_ms - 1 <= row["ts_ms"] < first_ms + 200 <= mtime_ms + 10
            assert row["ts_ms"] >= started_ms - 1
            if row["type"] == "watch":
                assert row["deadline_ms"] >= row["ts_ms"] - 1
    # About 2,000 events per second of the files' own time, however busy the machine
    # was (a thread that starts late covers less wall time, not fewer rows a second).
    span_s = (int(files[-1].stem.split("-")[1]) + 200 - int(files[0].stem.split("-")[1])) / 1e3
    assert 1_000 <= rows / span_s <= 3_000, (rows, span_s)
    assert sum(n for n, _ in landed) == rows + sum(
        1 for f in files for line in f.read_text().splitlines() if line in _MALFORMED_SET)


@pytest.mark.parametrize("rate", [100, 10**6])
def test_a_rate_out_of_range_is_refused(tmp_path: Path, rate: int) -> None:
    import threading

    from tickwheel.pipeline.tools.generator import follow_event_log

    with pytest.raises(ValueError, match="rate must be in"):
        follow_event_log(GeneratorConfig(), tmp_path, rate, threading.Event())
    assert not any(tmp_path.iterdir())
