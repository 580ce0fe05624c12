"""The JVM class archive: named for its PySpark and JVM, used when there, harmless when
wrong, and really mapped by a session's JVM."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest

from tickwheel.pipeline import class_archive
from tickwheel.pipeline.class_archive import (
    DISABLE_VARIABLE,
    STALE_AFTER_S,
    archive_options,
    archive_path,
    java_binary,
    main,
    make_archive,
    prune,
    unusable_because,
)


@pytest.fixture
def fake_java(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "jdk"
    (home / "bin").mkdir(parents=True)
    java = home / "bin" / "java"
    java.write_text("#!/bin/sh\n")
    monkeypatch.setenv("JAVA_HOME", str(home))
    # A space, so the options must quote the path as Spark splits them.
    monkeypatch.setenv("TICKWHEEL_CACHE_DIR", str(tmp_path / "cache dir"))
    monkeypatch.delenv(DISABLE_VARIABLE, raising=False)
    return java


def test_the_archive_is_named_for_the_pyspark_version_and_the_jvm_binary(
        fake_java: Path, tmp_path: Path) -> None:
    path = archive_path()
    assert path is not None
    assert path.parent == tmp_path / "cache dir"
    assert path.name.startswith(f"spark-{metadata.version('pyspark')}-jvm-")
    assert path.suffix == ".jsa"
    fake_java.write_text("#!/bin/sh\n# another build\n")
    assert archive_path() != path, "a replaced JVM must not reuse the old archive"


def test_the_archive_is_named_for_sparks_class_path(fake_java: Path, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The JVM refuses an archive made on another class path ("shared class paths
    mismatch"): a cache copied from another checkout or machine must not be reused."""
    def spark_home(name: str) -> Path:
        home = tmp_path / name
        (home / "jars").mkdir(parents=True)
        for jar in ("spark-core.jar", "scala-library.jar"):
            (home / "jars" / jar).write_bytes(b"classes")
        monkeypatch.setenv("SPARK_HOME", str(home))
        return home

    home = spark_home("venv-a")
    here = archive_path()
    assert archive_path() == here, "the name must be stable for one installation"
    spark_home("venv-b")
    assert archive_path() != here, "the same jars elsewhere are another class path"
    monkeypatch.setenv("SPARK_HOME", str(home))
    assert archive_path() == here
    (home / "jars" / "scala-library.jar").write_bytes(b"other classes")
    assert archive_path() != here, "a replaced jar is another class path"
    changed = archive_path()
    monkeypatch.setenv("SPARK_DIST_CLASSPATH", "/opt/hadoop/lib/x.jar")
    assert archive_path() != changed, "the launcher adds this to the class path"


@pytest.mark.parametrize("variable", ["SPARK_CONF_DIR", "HADOOP_CONF_DIR", "YARN_CONF_DIR"])
def test_a_non_empty_directory_on_sparks_class_path_rules_the_archive_out(
        variable: str, fake_java: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """The JVM refuses to dump or map an archive whose class path has a non-empty
    directory (measured: "Cannot have non-empty directory in paths"), and Spark's
    launcher puts its conf directories there: no training, no option, and set-up
    says why instead of failing."""
    conf = tmp_path / "conf"
    conf.mkdir()
    monkeypatch.setenv(variable, str(conf))
    assert unusable_because() is None, "an empty directory is fine"
    (conf / "log4j2.properties").write_text("rootLogger.level = warn\n")
    reason = unusable_because()
    assert reason is not None and str(conf) in reason

    def no_training(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("trained for a class path no archive can serve")

    monkeypatch.setattr(class_archive.subprocess, "run", no_training)
    with pytest.raises(RuntimeError, match="non-empty directory"):
        make_archive()
    assert main([]) == 0
    assert "not made" in capsys.readouterr().out
    path = archive_path()
    assert path is not None
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"archive")
    assert archive_options() == ""


def test_without_a_jvm_there_is_no_archive_to_use_or_make(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "no-jdk"))
    monkeypatch.setenv("TICKWHEEL_CACHE_DIR", str(tmp_path / "cache"))
    assert java_binary() is None
    assert archive_path() is None
    assert archive_options() == ""
    assert make_archive() is None
    assert not (tmp_path / "cache").exists()


def test_options_name_the_archive_only_once_it_exists(fake_java: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    assert archive_options() == ""
    path = archive_path()
    assert path is not None
    path.parent.mkdir(parents=True)
    path.write_bytes(b"archive")
    options = shlex.split(archive_options())
    assert f"-XX:SharedArchiveFile={path}" in options
    assert "-Xshare:auto" in options  # never -Xshare:on: a bad archive must not stop a JVM
    monkeypatch.setenv(DISABLE_VARIABLE, "0")
    assert archive_options() == ""


def test_an_existing_archive_is_not_made_again(fake_java: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    path = archive_path()
    assert path is not None
    path.parent.mkdir(parents=True)
    path.write_bytes(b"archive")

    def no_training(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("trained although the archive exists")

    monkeypatch.setattr(class_archive.subprocess, "run", no_training)
    assert make_archive() == path


def test_a_failed_training_leaves_no_archive_and_says_why(fake_java: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    def failing(*args: Any, **kwargs: Any) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess(args, 3, "", "no JVM today")

    monkeypatch.setattr(class_archive.subprocess, "run", failing)
    with pytest.raises(RuntimeError, match=r"exit 3(.|\n)*no JVM today"):
        make_archive()
    path = archive_path()
    assert path is not None
    assert list(path.parent.iterdir()) == []


def _aged(path: Path, seconds: float) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"archive")
    then = time.time() - seconds
    os.utime(path, (then, then))
    return path


def test_archives_unused_for_a_month_and_stale_partial_files_are_deleted(
        fake_java: Path) -> None:
    current = archive_path()
    assert current is not None
    folder = current.parent
    day = 86_400
    kept = [_aged(current, STALE_AFTER_S + day),  # this PySpark's and JVM's: never
            _aged(folder / "spark-4.0.0-jvm-aaaaaaaaaaaa.jsa", STALE_AFTER_S - day),
            _aged(folder / ".spark-4.0.0-jvm-bbbbbbbbbbbb.jsa.12.partial", day // 2),
            _aged(folder / "notes.txt", 10 * STALE_AFTER_S)]  # not an archive
    gone = [_aged(folder / "spark-3.5.0-jvm-cccccccccccc.jsa", STALE_AFTER_S + day),
            _aged(folder / ".spark-4.0.0-jvm-dddddddddddd.jsa.13.partial", 2 * day)]
    assert sorted(prune()) == sorted(gone)
    assert all(path.exists() for path in kept)
    assert not any(path.exists() for path in gone)


def test_a_session_naming_the_archive_marks_it_used(fake_java: Path) -> None:
    current = archive_path()
    assert current is not None
    _aged(current, STALE_AFTER_S - 86_400)
    assert archive_options()
    assert time.time() - current.stat().st_mtime < 60
    assert prune() == []


needs_java = pytest.mark.skipif(java_binary() is None, reason="no JVM here")


@needs_java
def test_a_corrupt_archive_leaves_the_jvm_running_without_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TICKWHEEL_CACHE_DIR", str(tmp_path / "cache dir"))
    monkeypatch.delenv(DISABLE_VARIABLE, raising=False)
    path = archive_path()
    assert path is not None
    path.parent.mkdir()
    path.write_bytes(os.urandom(64 * 1024))
    java = java_binary()
    assert java is not None
    done = subprocess.run([str(java), *shlex.split(archive_options()), "-version"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert "error" not in done.stderr.lower()


def _made_archive() -> Path:
    if os.environ.get(DISABLE_VARIABLE) == "0":
        pytest.skip(f"{DISABLE_VARIABLE}=0")
    if (reason := unusable_because()) is not None:
        pytest.skip(reason)
    path = archive_path()
    assert path is not None and path.is_file(), (
        "no Spark class archive: `python -m tickwheel.pipeline.class_archive` makes it "
        "(`make` does)")
    return path


@needs_java
def test_the_test_session_starts_with_the_archive(spark: Any) -> None:
    path = _made_archive()
    options = spark.sparkContext.getConf().get("spark.driver.extraJavaOptions")
    assert f"-XX:SharedArchiveFile={path}" in shlex.split(options)


SESSION_WITH_ARCHIVE_REQUIRED = """
from tickwheel.pipeline.class_archive import archive_options
from tickwheel.pipeline.spark_engine import LOCAL_JAVA_OPTIONS, spark_session
options = archive_options().replace("-Xshare:auto", "-Xshare:on")
spark = spark_session("local[1]", java_options=f"{LOCAL_JAVA_OPTIONS} {options}")
print(spark.range(7).count())
"""


@needs_java
def test_the_made_archive_maps_into_a_local_sessions_jvm() -> None:
    """With ``-Xshare:on`` a JVM that cannot map the archive (another JVM build, another
    class path) does not start at all: this session starting proves the one the
    engine's sessions name is usable, not silently ignored."""
    _made_archive()
    done = subprocess.run([sys.executable, "-c", SESSION_WITH_ARCHIVE_REQUIRED],
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "7"
