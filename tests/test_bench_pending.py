"""The pending benchmark's logs: the same small files in both, and before them in the
busy log one file of watches that stay pending; bad arguments are refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks._pending import write_logs
from tickwheel.pipeline.engines.reference import ReferenceEngine


def test_the_busy_log_is_the_quiet_one_with_operations_pending_throughout(
        tmp_path: Path) -> None:
    quiet, busy = write_logs(tmp_path, pending=300, files=4, rows=200)
    small = sorted(path.name for path in quiet.iterdir())
    assert small == [f"events-{n:05d}.jsonl" for n in range(1, 5)]
    assert sorted(path.name for path in busy.iterdir()) == ["events-00000.jsonl", *small]
    for name in small:
        assert (quiet / name).read_bytes() == (busy / name).read_bytes()
    results = []
    for log in (quiet, busy):
        engine = ReferenceEngine()
        for path in sorted(log.iterdir()):
            engine.feed_lines(path.read_text().splitlines())
        results.append(engine.run())
    # The cancels of the small files find some of the far watches; the rest stay.
    cancelled = sum(1 for o in results[1].outcomes if o.op_id.startswith("task-"))
    assert results[1].pending == results[0].pending + 300 - cancelled
    assert 0 < cancelled < 300


@pytest.mark.parametrize("argv", [["--files", "3"], ["--pending", "0"], ["--rows", "x"],
                                  ["--engines", "local,flink"]])
def test_bad_arguments_are_refused_before_any_work(argv: list[str]) -> None:
    from benchmarks.__main__ import main

    with pytest.raises(SystemExit) as stop:
        exit_code = main(["pending", *argv])
        raise SystemExit(exit_code)
    assert stop.value.code == 2
