"""The repository speaks of tickwheel, not of how it was developed: no numbered work
sessions, no tracker tickets, no source articles named as a document. Heartbeat
sessions, ``SparkSession`` and ``--seed`` are the domain's own words and stay. Code and
docs describe what is: dated figures live in docs/benchmarks.md and the README's
benchmark lines, and no comment or page narrates how the code changed."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Written in pieces so that this file does not match itself.
_PHRASES = re.compile(
    "|".join([
        r"\b(?:work |coding )?" + "sess" + r"ion \d+\b",
        r"\bthe " + "iss" + r"ue\b",
        r"\bthe " + "se" + r"eds?\b(?! \d)",
        r"\bsteer" + r"ing\b",
    ]),
    re.IGNORECASE,
)
_TEXT = (".py", ".md", ".toml", ".txt", ".cfg", ".c", ".sh", ".yml", ".yaml", "Makefile",
         ".ci/run")


def _tracked_text_files() -> list[Path]:
    names = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                           check=True).stdout.splitlines()
    return [ROOT / n for n in names if n.endswith(_TEXT)]


def test_no_tracked_text_speaks_of_how_tickwheel_was_developed() -> None:
    files = _tracked_text_files()
    assert len(files) > 50
    found = []
    for path in files:
        text = path.read_text(encoding="utf-8", errors="replace")
        for number, line in enumerate(text.splitlines(), 1):
            match = _PHRASES.search(line)
            if match:
                found.append(f"{path.relative_to(ROOT)}:{number}: {match.group(0)!r}")
    assert not found, "\n".join(found)


def test_the_check_catches_each_phrase() -> None:
    for bad in ("as measured in " + "sess" + "ion 22", "see " + "the iss" + "ue",
                "as " + "the se" + "eds say"):
        assert _PHRASES.search(bad), bad
    for fine in ("a heartbeat session expires", "SparkSession", "--seed 7",
                 "the se" + "ed 7 log"):  # a seed number is a generator option
        assert not _PHRASES.search(fine), fine


# Narrating a change, not describing what is (written in pieces, as above).
_HISTORY = re.compile(
    "|".join([
        r"\bused " + r"to (?:be|add|lengthen|fail|take|keep|run|walk|hold)\b",
        r"\bin an earl" + r"ier (?:version|build)\b",
        r"\ban earl" + r"ier build\b",
        r"\ba lat" + r"er change\b",
        r"\bthe first vers" + r"ion of this\b",
        r"\bwent fr" + r"om [\d,.]+ (?:to|ms)",
        r"(?:^|[.:] )Bef" + r"ore, ",
        r"\b[\d,.]+ \w+ bef" + r"ore and [\d,.]+ \w+ now\b",
        r"\bagainst [\d,.]+ \w* ?bef" + r"ore\b",
    ]),
    re.IGNORECASE,
)
_DATE = re.compile(r"\b20\d\d-[01]\d-[0-3]\d\b")
# Where a date is a figure's (benchmark tables) or a worked example's (a DST transition).
_DATES_BELONG = {"docs/benchmarks.md", "README.md", "docs/schedules.md"}


def test_docs_and_comments_say_what_is_and_dated_figures_stay_with_the_benchmarks(
        ) -> None:
    found = []
    for path in _tracked_text_files():
        name = str(path.relative_to(ROOT))
        if name.startswith("tests/") or name == "docs/benchmarks.md":
            continue  # tests quote history to check it; the benchmarks' log is dated
        text = path.read_text(encoding="utf-8", errors="replace")
        for number, line in enumerate(text.splitlines(), 1):
            match = _HISTORY.search(line)
            if match is None and name not in _DATES_BELONG and name.startswith("docs/"):
                match = _DATE.search(line)
            if match:
                found.append(f"{name}:{number}: {match.group(0)!r}")
    assert not found, "\n".join(found)


def test_the_history_check_catches_each_phrase() -> None:
    for bad in ("two things used " + "to lengthen the tail",
                "Spark's source, in an earl" + "ier version of this engine",
                "the p99 went fr" + "om 214 to 162 ms",
                "a log of changes. Bef" + "ore, the state was one value",
                "a batch took 5.3 s bef" + "ore and 1.9 s now",
                "takes 114 bytes, against 140 bef" + "ore"):
        assert _HISTORY.search(bad), bad
    for fine in ("the lock is no longer held", "a later row", "used for the outputs",
                 "rows before, at and after the deadline", "the batch before it"):
        assert not _HISTORY.search(fine), fine
    assert _DATE.search("results of 2026-11-28")
