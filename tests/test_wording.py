"""The repository speaks of tickwheel, not of how it was developed: no numbered work
sessions, no tracker tickets, no source articles named as a document. Heartbeat
sessions, ``SparkSession`` and ``--seed`` are the domain's own words and stay."""

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
