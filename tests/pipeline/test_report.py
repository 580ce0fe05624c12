"""Reports of an engine's outputs: counts and exact latency percentiles per kind, read as
Arrow columns."""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from tickwheel.cli import app
from tickwheel.pipeline.contract.events import OutcomeKind, Quarantined, Reason
from tickwheel.pipeline.contract.outcomes import OutcomeRow
from tickwheel.pipeline.io.outputs import (
    OutputDirError,
    count_outputs,
    outcomes_table,
    read_output_table,
    write_atomically,
    write_outcomes,
    write_quarantine,
)
from tickwheel.pipeline.tools.report import MAX_KINDS, OTHER_KINDS, kind_of, plot, summarize


def _outcome(op_id: str, outcome: str, latency_ms: int, resolved_ms: int = 0) -> OutcomeRow:
    return OutcomeRow(op_id, OutcomeKind(outcome), resolved_ms, latency_ms, ("k",),
                      "E" if outcome == "error" else None)


def _expected(rows: list[OutcomeRow]) -> tuple[dict[str, dict[str, int]],
                                               dict[str, tuple[int, int, int, int]]]:
    """The summary by hand: every row a Python object, the rarest kinds folded."""
    kinds = Counter(kind_of(r.op_id) for r in rows)
    kept = {k for k, _ in sorted(kinds.items(), key=lambda kv: (-kv[1], kv[0]))[:MAX_KINDS]}
    counts: dict[str, Counter[str]] = {}
    latencies: dict[str, list[int]] = {}
    for r in rows:
        kind = kind_of(r.op_id) if kind_of(r.op_id) in kept else OTHER_KINDS
        counts.setdefault(kind, Counter())[r.outcome.value] += 1
        latencies.setdefault(kind, []).append(r.latency_ms)
    percentiles = {}
    for kind, values in latencies.items():
        values.sort()
        at = [values[min(len(values) - 1, round(q * (len(values) - 1)))]
              for q in (0.5, 0.9, 0.99)]
        percentiles[kind] = (at[0], at[1], at[2], values[-1])
    order = sorted(counts, key=lambda k: (k == OTHER_KINDS, k))
    return ({k: dict(sorted(counts[k].items())) for k in order},
            {k: percentiles[k] for k in order})


@pytest.mark.parametrize("kinds", [3, MAX_KINDS, MAX_KINDS + 5])
def test_a_summary_counts_every_outcome_and_gives_exact_percentiles_per_kind(
        tmp_path: Path, kinds: int) -> None:
    rng = random.Random(kinds)
    names = [f"kind{i}" for i in range(kinds)]
    rows = [_outcome(f"{rng.choice(names)}-{i}", rng.choice(list(OutcomeKind)).value,
                     rng.randint(0, 5_000)) for i in range(3_000)]
    rows += [_outcome(f"uuid-like-{i}x", "expired", 7) for i in range(20)]  # each its own kind
    write_outcomes(rows[:1_000], tmp_path / "outcomes")
    # A second file, as a follow-mode batch writes it.
    write_atomically(outcomes_table(rows[1_000:]),
                     tmp_path / "outcomes" / "batch-000000001.parquet")
    write_quarantine([Quarantined("x", Reason.UNPARSEABLE, None)] * 3
                     + [Quarantined("y", Reason.LATE, 5)], tmp_path / "quarantine")
    summary = summarize(tmp_path)
    outcomes, latency = _expected(rows)
    assert list(summary.outcomes) == list(outcomes) and summary.outcomes == outcomes
    assert summary.latency == latency
    assert summary.quarantine == {"late": 1, "unparseable": 3}
    assert summary.total_outcomes == len(rows)
    assert (OTHER_KINDS in summary.outcomes) == (kinds + 20 > MAX_KINDS)
    assert plot(tmp_path).read_bytes()[:4] == b"\x89PNG"


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet="ab-09٣\n²", max_size=8))
def test_the_kind_of_an_id_is_the_same_in_python_and_in_arrow(op_id: str) -> None:
    import pyarrow as pa
    import pyarrow.compute as pc

    from tickwheel.pipeline.tools.report import _KIND_PATTERN

    arrow = pc.replace_substring_regex(pa.array([op_id]), pattern=_KIND_PATTERN,
                                       replacement=r"\1")[0].as_py()
    assert arrow == kind_of(op_id)


def test_only_ascii_digits_make_a_numeric_suffix() -> None:
    assert kind_of("produce-17") == "produce"
    assert kind_of("a-1-2") == "a-1"
    assert [kind_of(i) for i in ("-5", "a-", "a-٣", "a-²", "task")] == [
        "-5", "a-", "a-٣", "a-²", "task"]


def test_empty_outputs_give_an_empty_summary_and_a_plot(tmp_path: Path) -> None:
    (tmp_path / "outcomes").mkdir()
    summary = summarize(tmp_path)
    assert (summary.outcomes, summary.latency, summary.quarantine) == ({}, {}, {})
    assert plot(tmp_path).exists()


def test_only_the_columns_asked_for_are_read_and_counted(tmp_path: Path) -> None:
    write_outcomes([_outcome("a-1", "completed", 3), _outcome("b-2", "expired", 4)],
                   tmp_path / "outcomes")
    table = read_output_table(tmp_path / "outcomes", ["latency_ms"])
    assert table.column_names == ["latency_ms"] and table.column(0).to_pylist() == [3, 4]
    assert count_outputs(tmp_path / "outcomes", "outcome") == {"completed": 1, "expired": 1}
    assert count_outputs(tmp_path / "nowhere", "outcome") == {}


def test_an_output_file_that_is_not_parquet_is_refused_by_name(tmp_path: Path) -> None:
    (tmp_path / "outcomes").mkdir()
    (tmp_path / "outcomes" / "part-00000.parquet").write_bytes(b"garbage")
    with pytest.raises(OutputDirError, match=r"part-00000\.parquet cannot be read"):
        summarize(tmp_path)
    result = CliRunner().invoke(app, ["report", "--output", str(tmp_path)])
    assert result.exit_code == 1 and "cannot be read" in result.output, result.output


def test_the_json_report_is_the_summary_and_writes_no_plot_unless_asked(
        tmp_path: Path) -> None:
    import json

    rows = [_outcome("produce-1", "completed", 40), _outcome("produce-2", "expired", 900),
            _outcome("fetch-1", "completed", 5)]
    write_outcomes(rows, tmp_path / "outcomes")
    write_quarantine([Quarantined("x", Reason.UNPARSEABLE, None)], tmp_path / "quarantine")
    result = CliRunner().invoke(app, ["report", "--output", str(tmp_path), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == {
        "outcomes": 3,
        "kinds": {
            "fetch": {"outcomes": {"completed": 1},
                      "latency_ms": {"p50": 5, "p90": 5, "p99": 5, "max": 5}},
            "produce": {"outcomes": {"completed": 1, "expired": 1},
                        "latency_ms": {"p50": 40, "p90": 900, "p99": 900, "max": 900}},
        },
        "quarantine": {"unparseable": 1},
        "skipped": 0,
    }
    assert not (tmp_path / "report.png").exists()
    picture = tmp_path / "elsewhere.png"
    result = CliRunner().invoke(app, ["report", "--output", str(tmp_path), "--json",
                                      "--plot", str(picture)])
    assert result.exit_code == 0 and json.loads(result.stdout)["outcomes"] == 3
    assert picture.read_bytes()[:4] == b"\x89PNG"
