"""A class-data-sharing archive for the JVM of a local Spark session.

A cold local session spends seconds loading, parsing and verifying tens of thousands of
classes (Spark SQL, the streaming engine, RocksDB, Arrow, Janino) before and during its
first query. The JVM can map them from an archive instead (JDK 13+: AppCDS,
``-XX:SharedArchiveFile``), and dumps one at exit after a training run
(``-XX:ArchiveClassesAtExit``). On this 2-core machine a cold 1M-event run on local[2]
took 0.6-1.2 s less with it (of 10-11 s) and the whole process, session start-up
included, 3.5-5 s less (of 26-29 s; three pairs of fresh processes); warm runs were
unchanged.

:func:`make_archive` trains once, in a child process, by running the engine over a
small generated log, and keeps the archive in the cache directory under a name that
changes with the PySpark version, the ``java`` binary and Spark's class path (where
the jars are, in which order, and each one's size and time), so an upgrade, another
virtual environment or a cache copied from another machine leads to a new archive
instead of a mismatched one. :func:`archive_options` names it to the JVM when it is
there; ``spark_session`` adds them for a local master. The JVM checks the archive
against itself and its class path and, with ``-Xshare:auto``, runs without it if they
disagree: an archive can make a session faster, never fail it. A non-empty directory
on the class path (a Spark conf directory with files in it, ``HADOOP_CONF_DIR``) rules
an archive out, as the JVM neither dumps nor maps one then: set-up says so and
sessions start without it (:func:`unusable_because`).

``python -m tickwheel.pipeline.class_archive`` makes it (``make`` does); the archive is
about 180 MB.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import logging
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path

__all__ = ["archive_options", "archive_path", "cache_dir", "java_binary", "make_archive", "prune",
           "unusable_because"]

log = logging.getLogger(__name__)

#: Set to ``0`` to leave sessions without the archive (and ``make`` from making one).
DISABLE_VARIABLE = "TICKWHEEL_SPARK_CLASS_ARCHIVE"

_TRAINING_EVENTS = 20_000

#: Archives no session has named for this long are deleted whenever the archive is
#: made or checked (each ``make``): every PySpark or JDK upgrade leaves one behind.
STALE_AFTER_S = 30 * 86_400
# A session refreshes its archive's mtime at most this often: the mark of use above.
_MARK_USED_EVERY_S = 86_400
# A training interrupted hard (its JVM killed) can leave a partial file behind.
_PARTIAL_STALE_AFTER_S = 86_400


def cache_dir() -> Path:
    """``$TICKWHEEL_CACHE_DIR``, else ``$XDG_CACHE_HOME/tickwheel``, else
    ``~/.cache/tickwheel``."""
    explicit = os.environ.get("TICKWHEEL_CACHE_DIR")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "tickwheel"


def java_binary() -> Path | None:
    """The ``java`` that Spark's launcher runs: ``$JAVA_HOME/bin/java``, else the one on
    the ``PATH``."""
    home = os.environ.get("JAVA_HOME")
    found = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    if found is None or not os.path.isfile(found):
        return None
    return Path(os.path.realpath(found))


# Environment variables Spark's launcher puts on the driver's class path.
_CLASS_PATH_VARIABLES = ("SPARK_CONF_DIR", "SPARK_DIST_CLASSPATH", "SPARK_CLASSPATH",
                         "HADOOP_CONF_DIR", "YARN_CONF_DIR")


def _spark_home() -> Path | None:
    """``$SPARK_HOME``, else the PySpark package (a pip install is its own Spark home),
    found without importing it."""
    explicit = os.environ.get("SPARK_HOME")
    if explicit:
        return Path(explicit)
    spec = importlib.util.find_spec("pyspark")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def unusable_because() -> str | None:
    """Why no archive can serve Spark's class path here, or None.

    The JVM neither dumps nor maps an archive whose class path has a non-empty
    directory ("Cannot have non-empty directory in paths"), and Spark's launcher puts
    its conf directory (``$SPARK_CONF_DIR``, else ``$SPARK_HOME/conf``) first on the
    class path, and ``$HADOOP_CONF_DIR`` and ``$YARN_CONF_DIR`` when set. A pip
    install of PySpark has no conf directory."""
    home = _spark_home()
    conf = os.environ.get("SPARK_CONF_DIR") or (str(home / "conf") if home else "")
    directories = [conf, os.environ.get("HADOOP_CONF_DIR", ""),
                   os.environ.get("YARN_CONF_DIR", "")]
    for variable in ("SPARK_DIST_CLASSPATH", "SPARK_CLASSPATH"):
        directories += os.environ.get(variable, "").split(os.pathsep)
    for directory in filter(None, directories):
        try:
            with os.scandir(directory) as entries:
                if next(entries, None) is not None:
                    return f"Spark's class path has a non-empty directory, {directory}"
        except OSError:
            continue  # not a directory, or not there: the JVM accepts both
    return None


def _class_path_identity() -> str:
    """What the JVM checks an archive's class path against: the jars' directory, their
    order (the launcher's ``jars/*`` expands in directory order, as ``os.scandir``
    lists it), and each jar's size and modification time."""
    home = _spark_home()
    parts = [os.path.realpath(home) if home else "",
             *(f"{name}={os.environ.get(name, '')}" for name in _CLASS_PATH_VARIABLES)]
    if home is not None:
        try:
            with os.scandir(home / "jars") as entries:
                for entry in entries:
                    stat = entry.stat()
                    parts.append(f"{entry.name}:{stat.st_size}:{stat.st_mtime_ns}")
        except OSError:
            parts.append("no jars")
    return "\0".join(parts)


def archive_path(directory: Path | None = None) -> Path | None:
    """Where the archive for this PySpark, this JVM and this class path lives (whether
    or not it has been made); None without a JVM or PySpark."""
    java = java_binary()
    if java is None:
        return None
    try:
        pyspark = metadata.version("pyspark")
    except metadata.PackageNotFoundError:
        return None
    stat = java.stat()
    # The binary's identity stands for the JVM build: a JDK update replaces the file.
    identity = f"{java}\0{stat.st_size}\0{stat.st_mtime_ns}\0{_class_path_identity()}"
    digest = hashlib.sha256(identity.encode()).hexdigest()
    return (directory or cache_dir()) / f"spark-{pyspark}-jvm-{digest[:12]}.jsa"


def _disabled() -> bool:
    return os.environ.get(DISABLE_VARIABLE, "1").strip().lower() in ("0", "false", "no", "off")


def archive_options(directory: Path | None = None) -> str:
    """The JVM options that use the archive, or ``""`` when there is none (or
    :data:`DISABLE_VARIABLE` is ``0``). Marks the archive as used (see
    :func:`prune`)."""
    if _disabled() or unusable_because() is not None:
        return ""
    path = archive_path(directory)
    if path is None or not path.is_file():
        return ""
    _mark_used(path)
    # The JVM logs a mismatched archive as a warning on its console before running
    # without it: quiet, since that is the designed outcome.
    # Quoted as Spark splits extraJavaOptions: like a shell.
    archive = shlex.quote(f"-XX:SharedArchiveFile={path}")
    return f"{archive} -Xshare:auto -Xlog:cds=off -Xlog:cds+dynamic=off"


def _mark_used(path: Path) -> None:
    try:
        if time.time() - path.stat().st_mtime > _MARK_USED_EVERY_S:
            os.utime(path)
    except OSError:
        pass  # a cache this user cannot write to still serves


def prune(directory: Path | None = None, now: float | None = None) -> list[Path]:
    """Delete the archives in the cache that no session has named for
    :data:`STALE_AFTER_S` and partial files of interrupted trainings, except the
    archive for this PySpark and JVM; return what was deleted."""
    folder = directory or cache_dir()
    current = archive_path(folder)
    now = time.time() if now is None else now
    deleted = []
    candidates = [*folder.glob("spark-*-jvm-*.jsa"), *folder.glob(".spark-*-jvm-*.jsa.*.partial")]
    for path in candidates:
        limit = _PARTIAL_STALE_AFTER_S if path.name.endswith(".partial") else STALE_AFTER_S
        try:
            if path != current and now - path.stat().st_mtime > limit:
                path.unlink()
                deleted.append(path)
        except OSError:
            continue  # gone already (another prune), or not ours to delete
    for path in deleted:
        log.info("deleted the unused Spark class archive %s", path)
    return deleted


def make_archive(directory: Path | None = None, timeout_s: float = 900.0) -> Path | None:
    """Make the archive unless it is there already; return its path, or None when there
    is no JVM or PySpark to make it for. Raises ``RuntimeError`` if the training run
    fails."""
    path = archive_path(directory)
    if path is None or path.is_file():
        return path
    reason = unusable_because()
    if reason is not None:
        raise RuntimeError(f"no Spark class archive can be made here: {reason}")
    path.parent.mkdir(parents=True, exist_ok=True)
    # Written under a name of its own and renamed when whole: two makers at once each
    # write their own, and a reader never maps a half-written archive.
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="tickwheel-class-archive-") as work:
        jvm_log = Path(work) / "jvm.log"
        done = subprocess.run(
            [sys.executable, "-m", "tickwheel.pipeline.class_archive", "--train", str(partial),
             "--work", work],
            capture_output=True, text=True, timeout=timeout_s, check=False)
        if done.returncode != 0 or not partial.is_file() or partial.stat().st_size == 0:
            partial.unlink(missing_ok=True)
            console = jvm_log.read_text(errors="replace")[-2000:] if jvm_log.exists() else ""
            raise RuntimeError(f"training the Spark class archive failed (exit "
                               f"{done.returncode}):\n{done.stderr[-2000:]}\n{console}")
    os.replace(partial, path)
    log.info("Spark class archive %s made in %.0f s", path, time.perf_counter() - started)
    return path


def _train(archive: Path, work: Path) -> None:
    """Run the engine over a small log in a JVM that dumps the classes it loaded into
    ``archive`` when it exits, and wait for that exit."""
    from pyspark import SparkContext

    from tickwheel.pipeline.generator import GeneratorConfig, write_event_log
    from tickwheel.pipeline.spark_engine import LOCAL_JAVA_OPTIONS, SparkEngine, spark_session

    events = work / "events"
    write_event_log(GeneratorConfig(events=_TRAINING_EVENTS, rows_per_file=_TRAINING_EVENTS // 4,
                                    malformed_fraction=0.01), events)
    spark = spark_session("local[2]", app_name="tickwheel-class-archive",
                          jvm_log=work / "jvm.log",
                          java_options=f"{LOCAL_JAVA_OPTIONS} -XX:ArchiveClassesAtExit={archive}")
    SparkEngine(spark, events, work / "out", work / "checkpoint", max_files_per_trigger=2).run()
    proc = getattr(SparkContext._gateway, "proc", None)
    spark.stop()
    if proc is None:
        raise RuntimeError("the JVM was not started by this process")
    # The gateway JVM exits when its stdin closes (PySpark's way of never outliving
    # the driver), and dumps the archive on the way out.
    proc.stdin.close()
    proc.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tickwheel.pipeline.class_archive",
        description="Make the JVM class archive that local Spark sessions start faster with.")
    parser.add_argument("--dir", type=Path, default=None,
                        help=f"where to keep it (default: {cache_dir()})")
    parser.add_argument("--train", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--work", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.train is not None:
        _train(args.train, args.work)
        return 0
    if _disabled():
        print(f"Spark class archive: off ({DISABLE_VARIABLE}=0)")
        return 0
    for stale in prune(args.dir):
        print(f"Spark class archive: deleted {stale}, unused for {STALE_AFTER_S // 86_400} days")
    print(f"Spark class archive: {_set_up(args.dir)}")
    return 0


def _set_up(directory: Path | None) -> str:
    """Make the archive unless it is there or cannot be; say which. Never fails: sessions
    run without an archive, only slower to start, which is no reason to fail a set-up."""
    path = archive_path(directory)
    if path is None:
        return "no JVM or no PySpark here, nothing to make"
    if path.is_file():
        return str(path)
    reason = unusable_because()
    if reason is not None:
        return f"not made, sessions start without it: {reason}"
    print("Spark class archive: training a local Spark session once (about a minute) ...",
          flush=True)
    try:
        return str(make_archive(directory))
    except (OSError, RuntimeError, subprocess.TimeoutExpired) as exc:
        return f"not made, sessions start without it: {exc}"


if __name__ == "__main__":
    raise SystemExit(main())
