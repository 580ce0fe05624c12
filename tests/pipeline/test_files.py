"""Files written whole: never through a link or file planted at a temporary name."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tickwheel.pipeline.io import files
from tickwheel.pipeline.io.files import is_temporary_of, open_temporary, write_bytes_atomically


def test_a_symlink_planted_at_the_drawn_name_is_passed_over(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    victim = tmp_path / "victim"
    victim.write_text("precious")
    draws = iter(["deadbeef", "deadbeef", "0badf00d"])
    monkeypatch.setattr(files.secrets, "token_hex", lambda _n: next(draws))
    (tmp_path / ".target.deadbeef.tmp").symlink_to(victim)
    write_bytes_atomically(b"new", tmp_path / "target")
    assert victim.read_text() == "precious"
    assert (tmp_path / "target").read_bytes() == b"new"
    assert (tmp_path / ".target.deadbeef.tmp").is_symlink()  # left alone
    assert not (tmp_path / ".target.0badf00d.tmp").exists()  # renamed into place


def test_a_write_that_fails_leaves_no_temporary_file(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    def no_rename(*_args: object) -> None:
        raise OSError("disk gone")

    monkeypatch.setattr(os, "replace", no_rename)
    with pytest.raises(OSError, match="disk gone"):
        write_bytes_atomically(b"x", tmp_path / "target")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("sync", [True, False])
def test_a_synced_write_is_durable_before_its_rename(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sync: bool) -> None:
    # Durable: opened with O_DSYNC (each write synced as it returns), or fsync'd.
    events: list[str] = []
    real_open, real_fsync, real_replace = os.open, os.fsync, os.replace

    def opening(path: Any, flags: int, *args: Any) -> int:
        dsync = bool(flags & getattr(os, "O_DSYNC", 0))
        events.append("open dsync" if dsync else "open")
        return real_open(path, flags, *args)

    def syncing(fd: int) -> None:
        events.append("fsync")
        real_fsync(fd)

    def replacing(*args: Any) -> None:
        events.append("rename")
        real_replace(*args)

    monkeypatch.setattr(os, "open", opening)
    monkeypatch.setattr(os, "fsync", syncing)
    monkeypatch.setattr(os, "replace", replacing)
    write_bytes_atomically(b"x" * 100_000, tmp_path / "target", sync=sync)
    assert (tmp_path / "target").read_bytes() == b"x" * 100_000
    if sync:
        assert events in (["open dsync", "rename"], ["open", "fsync", "rename"])
    else:
        assert events == ["open", "rename"]


def test_temporary_files_take_the_umask_mode(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        out, tmp = open_temporary(tmp_path / "t")
        out.close()
    finally:
        os.umask(old)
    assert tmp.stat().st_mode & 0o777 == 0o644
    assert is_temporary_of(tmp.name, ".t.")
    assert not is_temporary_of(".t.tmp", ".t.") and not is_temporary_of(".t.xyz.tmp", ".t.")


def test_spark_job_zip_does_not_write_through_a_planted_link(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("precious")
    (tmp_path / ".tw.zip.tmp").symlink_to(victim)
    done = subprocess.run([sys.executable, "-m", "tickwheel.pipeline.spark.job", "--zip", "tw.zip"],
                          check=False, cwd=tmp_path, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert victim.read_text() == "precious"
    assert (tmp_path / "tw.zip").read_bytes()[:2] == b"PK"
