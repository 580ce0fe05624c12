"""Output files: written as their rows come, a row group at a time, and in place
whole or not at all."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tickwheel.pipeline.contract.events import OutcomeKind, Quarantined, Reason
from tickwheel.pipeline.contract.outcomes import OutcomeRow
from tickwheel.pipeline.io.outputs import (
    OutputDirError,
    OutputWriter,
    outcomes_table,
    prepare_output,
    quarantine_table,
    quarantine_writer,
    read_outcomes,
    read_parquet_rows,
)


def outcome(i: int) -> OutcomeRow:
    return OutcomeRow(f"op-{i}", OutcomeKind.COMPLETED, 100 + i, i, ("k", f"k{i}"), None)


def test_rows_are_written_a_row_group_at_a_time_in_the_order_they_came(
        tmp_path: Path) -> None:
    with OutputWriter(tmp_path / "outcomes", outcomes_table, group_rows=3) as writer:
        for start in (0, 4, 5):
            writer.write([outcome(i) for i in range(start, start + (4 if start == 0 else 1))])
            # No file in place until the writer closes.
            assert not writer.path.exists()
        writer.write([outcome(i) for i in range(6, 10)])
    assert writer.rows == 10
    assert pq.ParquetFile(writer.path).metadata.num_row_groups == 4
    assert list(read_outcomes(writer.path, batch_rows=4)) == [outcome(i) for i in range(10)]
    assert [p.name for p in (tmp_path / "outcomes").iterdir()] == ["part-00000.parquet"]


def test_rows_of_large_text_are_written_in_row_groups_of_bounded_bytes(
        tmp_path: Path) -> None:
    lines = [f"{i:04d}" + "x" * 300_000 for i in range(40)]  # 12 MB of text
    with quarantine_writer(tmp_path / "quarantine") as writer:
        writer.write(Quarantined(line, Reason.UNPARSEABLE, None) for line in lines[:30])
        writer.write([Quarantined(line, Reason.UNPARSEABLE, None) for line in lines[30:]])
    file = pq.ParquetFile(writer.path)
    # 16 MB a row group at most: no group of all 40 rows, and none of one row.
    assert file.metadata.num_row_groups == 1
    with OutputWriter(tmp_path / "small" / "quarantine", quarantine_table, group_bytes=1_000_000,
                      row_bytes=lambda q: len(q.raw)) as writer:
        writer.write(Quarantined(line, Reason.UNPARSEABLE, None) for line in lines)
    groups = pq.ParquetFile(writer.path).metadata
    assert [groups.row_group(g).num_rows for g in range(groups.num_row_groups)] == [4] * 10
    assert [r["raw"] for r in read_parquet_rows(tmp_path / "small" / "quarantine")] == lines


def test_a_writer_of_no_rows_still_writes_a_file_with_the_columns(tmp_path: Path) -> None:
    with OutputWriter(tmp_path / "quarantine", quarantine_table):
        pass
    assert read_parquet_rows(tmp_path / "quarantine") == []
    assert pq.read_schema(tmp_path / "quarantine" / "part-00000.parquet").names == [
        "raw", "reason", "ts_ms"]


def test_an_error_while_writing_leaves_no_file(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="resolving failed"), \
            OutputWriter(tmp_path / "quarantine", quarantine_table, group_rows=1) as writer:
        writer.write([Quarantined("x", Reason.UNPARSEABLE, None)] * 3)
        raise RuntimeError("resolving failed")
    assert list((tmp_path / "quarantine").iterdir()) == []


def test_a_file_left_half_written_by_a_crash_is_an_earlier_runs_output(tmp_path: Path) -> None:
    (tmp_path / "outcomes").mkdir()
    (tmp_path / "outcomes" / ".part-00000.parquet.0123abcd.tmp").write_bytes(b"PAR1")
    with pytest.raises(OutputDirError, match="outputs of an earlier run"):
        prepare_output(tmp_path, overwrite=False)
    prepare_output(tmp_path, overwrite=True)
    assert not (tmp_path / "outcomes").exists()
