"""One owner per checkpoint and output directory: a second run is refused at start,
naming the holder; a killed owner blocks nobody; a run that lost its hold stops."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tickwheel.pipeline.io.ownership import (
    LOCK_FILE,
    OwnerLock,
    OwnershipError,
    OwnershipLost,
    hold_run_directories,
)

HOLD = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from tickwheel.pipeline.io.ownership import OwnerLock, OwnershipError
    try:
        lock = OwnerLock(Path(sys.argv[1]), "checkpoint")
    except OwnershipError as exc:
        print("refused:", exc, flush=True)
        sys.exit(3)
    print("holding", lock.epoch, flush=True)
    time.sleep(float(sys.argv[2]))
""")


def hold(directory: Path, seconds: float = 600) -> subprocess.Popen[str]:
    child = subprocess.Popen([sys.executable, "-c", HOLD, str(directory), str(seconds)],
                             stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None
    line = child.stdout.readline()
    assert line.startswith("holding"), line
    return child


def test_a_second_owner_is_refused_naming_the_holder(tmp_path: Path) -> None:
    child = hold(tmp_path / "ck")
    try:
        with pytest.raises(OwnershipError, match=rf"in use by pid {child.pid} on "):
            OwnerLock(tmp_path / "ck", "checkpoint")
    finally:
        child.kill()
        child.wait()


def test_a_killed_owner_blocks_nobody_and_the_epoch_moves_on(tmp_path: Path) -> None:
    child = hold(tmp_path / "ck")
    first = json.loads((tmp_path / "ck" / LOCK_FILE).read_text())["epoch"]
    child.send_signal(signal.SIGKILL)
    child.wait()
    with OwnerLock(tmp_path / "ck", "checkpoint") as lock:
        assert lock.epoch == first + 1 and lock.holder.pid == os.getpid()


@pytest.mark.slow
def test_two_owners_started_at_once_exactly_one_runs(tmp_path: Path) -> None:
    for attempt in range(10):
        directory = tmp_path / f"ck{attempt}"
        children = [subprocess.Popen([sys.executable, "-c", HOLD, str(directory), "2"],
                                     stdout=subprocess.PIPE, text=True) for _ in range(2)]
        outs = [c.communicate(timeout=120)[0] for c in children]
        codes = sorted(c.returncode for c in children)
        assert codes == [0, 3], outs
        assert sum(out.startswith("holding") for out in outs) == 1


def test_one_process_may_take_its_own_hold_again(tmp_path: Path) -> None:
    a = OwnerLock(tmp_path, "output")
    b = OwnerLock(tmp_path, "output")
    assert a.epoch == b.epoch
    a.release()
    b.check()  # still held: the process's last hold is b
    b.release()
    with pytest.raises(OwnershipLost):
        b.check()


def test_abandoning_takes_away_only_what_no_other_hold_still_uses(tmp_path: Path) -> None:
    first = OwnerLock(tmp_path / "new", "checkpoint")
    second = OwnerLock(tmp_path / "new", "checkpoint")
    first.abandon()  # the second hold still uses the directory and its lock
    assert (tmp_path / "new" / LOCK_FILE).exists()
    second.check()
    second.abandon()  # it did not create the directory: it stays
    assert (tmp_path / "new").is_dir()
    third = OwnerLock(tmp_path / "newer", "checkpoint")
    third.abandon()
    assert not (tmp_path / "newer").exists()


def test_a_replaced_directory_or_lock_file_is_noticed(tmp_path: Path) -> None:
    lock = OwnerLock(tmp_path / "ck", "checkpoint")
    lock.check()
    (tmp_path / "ck" / LOCK_FILE).unlink()
    with pytest.raises(OwnershipLost, match="replaced or its lock file removed"):
        lock.check()
    lock.release()
    lock = OwnerLock(tmp_path / "ck", "checkpoint")
    shutil.move(tmp_path / "ck", tmp_path / "old")
    (tmp_path / "ck").mkdir()
    with pytest.raises(OwnershipLost):
        lock.check()
    lock.release()


def test_a_symlink_at_the_lock_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "victim").write_text("precious")
    (tmp_path / "ck").mkdir()
    (tmp_path / "ck" / LOCK_FILE).symlink_to(tmp_path / "victim")
    with pytest.raises(OwnershipError, match="cannot be opened"):
        OwnerLock(tmp_path / "ck", "checkpoint")
    assert (tmp_path / "victim").read_text() == "precious"


def test_a_run_holds_its_checkpoint_then_its_output_or_neither(tmp_path: Path) -> None:
    child = hold(tmp_path / "out")
    try:
        with pytest.raises(OwnershipError, match="output"):
            hold_run_directories(tmp_path / "out", tmp_path / "ck")
        # The checkpoint was let go again: another process may take it.
        other = subprocess.run([sys.executable, "-c", HOLD, str(tmp_path / "ck"), "0"],
                               check=False, capture_output=True, text=True, timeout=120)
        assert other.returncode == 0, other.stdout
    finally:
        child.kill()
        child.wait()


# -- through the command -----------------------------------------------------------------

def run_command(tmp_path: Path, *options: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tickwheel.cli", "run", "--input", str(tmp_path / "in"),
         "--output", str(tmp_path / "out"), *options],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@pytest.mark.parametrize("second", [
    ("--follow",),
    ("--follow", "--trigger-ms", "50"),
    ("--engine", "local", "--overwrite"),
    ("--engine", "spark", "--overwrite"),
    ("--follow", "--engine", "spark"),
], ids=["follow", "follow, another trigger", "local batch", "spark batch", "spark follow"])
def test_a_live_service_refuses_every_second_run_before_it_starts(
        tmp_path: Path, second: tuple[str, ...]) -> None:
    (tmp_path / "in").mkdir()
    service = run_command(tmp_path, "--follow", "--trigger-ms", "100")
    try:
        assert service.stdout is not None
        line = service.stdout.readline()  # printed once it holds its directories
        assert "following" in line, line + service.stdout.read()
        done = subprocess.run(
            [sys.executable, "-m", "tickwheel.cli", "run", "--input", str(tmp_path / "in"),
             "--output", str(tmp_path / "out"), *second],
            check=False, capture_output=True, text=True, timeout=120)
        assert done.returncode == 2, done.stdout + done.stderr
        message = done.stdout + done.stderr
        assert f"in use by pid {service.pid} on" in message
        assert "Traceback" not in message and "starting Spark" not in message
        assert len(message.strip().splitlines()) == 1, message
    finally:
        service.send_signal(signal.SIGKILL)
        service.wait()
    # Killed with -9: the next run takes over.
    restarted = run_command(tmp_path, "--follow", "--trigger-ms", "100")
    try:
        assert restarted.stdout is not None
        line = restarted.stdout.readline()
        assert "following" in line, line + restarted.stdout.read()
    finally:
        restarted.send_signal(signal.SIGTERM)
        restarted.communicate(timeout=60)
    assert restarted.returncode == 0
