"""Gzip'd JSON Lines files (``*.jsonl.gz``, ``*.json.gz``) are read as the same files
uncompressed would be, by every reader of input; data that cannot be decompressed is
quarantined, never silently dropped."""

from __future__ import annotations

import gzip
import io
import itertools
import tracemalloc
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tickwheel.pipeline.contract.events import Quarantined, Reason
from tickwheel.pipeline.io.log_reader import input_bytes, json_lines, json_stream, read_events

ROWS = b"".join(b'{"ts_ms": %d, "type": "tick"}\n' % i for i in range(2_000))


def _lines(content: bytes, name: str = "events.jsonl.gz", slice_bytes: int = 8 << 20
           ) -> list[str]:
    stream = json_stream(io.BytesIO(content), name)
    return [line for lines in json_lines(stream, slice_bytes) for line in lines]


@pytest.mark.slow
@settings(max_examples=200, deadline=None)
@given(cuts=st.lists(st.integers(min_value=0, max_value=len(ROWS)), max_size=4),
       padding=st.integers(min_value=0, max_value=3),
       slice_bytes=st.integers(min_value=1, max_value=5_000))
def test_a_gzipd_file_has_the_lines_of_its_bytes_in_any_members_and_slices(
        cuts: list[int], padding: int, slice_bytes: int) -> None:
    # gzip -c a b > c makes one member per file; zero bytes may pad between members.
    edges = [0, *sorted(cuts), len(ROWS)]
    members = [gzip.compress(ROWS[a:b]) for a, b in itertools.pairwise(edges)]
    content = (b"\0" * padding).join(members)
    assert _lines(content, slice_bytes=slice_bytes) == _lines(ROWS, "events.jsonl",
                                                              slice_bytes)


def test_a_name_without_gz_is_read_as_it_is() -> None:
    packed = gzip.compress(ROWS)
    assert json_stream(stream := io.BytesIO(packed), "events.jsonl") is stream


def test_an_empty_gzipd_file_has_no_rows() -> None:
    assert _lines(b"") == []


def test_a_file_cut_short_gives_its_rows_then_one_row_naming_the_file() -> None:
    packed = gzip.compress(ROWS)
    lines = _lines(packed[: len(packed) // 2])
    whole = _lines(ROWS, "events.jsonl")
    assert lines[-1].startswith("unreadable gzip file events.jsonl.gz after ")
    assert lines[-1].endswith("bytes: the file ends inside its gzip data (cut short)")
    kept = lines[:-1]
    assert kept[:-1] == whole[: len(kept) - 1]  # every whole line before the cut
    assert whole[len(kept) - 1].startswith(kept[-1])  # the cut line, a row of its own


@pytest.mark.parametrize(("content", "fault"), [
    (b'{"ts_ms": 1, "type": "tick"}\n', "incorrect header check"),  # not gzip at all
    (gzip.compress(ROWS)[:-8] + b"\0" * 8, "incorrect data check"),  # its checksum wrong
    (gzip.compress(ROWS) + b"trailing junk", "incorrect header check"),
])
def test_data_that_cannot_be_decompressed_is_one_unparseable_row(
        tmp_path: Path, content: bytes, fault: str) -> None:
    (tmp_path / "events.jsonl.gz").write_bytes(content)
    rows = list(read_events(tmp_path))
    last = rows[-1]
    assert isinstance(last, Quarantined) and last.reason is Reason.UNPARSEABLE
    assert last.raw.startswith("unreadable gzip file events.jsonl.gz after ")
    assert last.raw.endswith(fault)


def test_an_error_reading_the_file_itself_is_raised_not_quarantined() -> None:
    packed = gzip.compress(ROWS)

    class Failing(io.BytesIO):
        def read(self, size: int | None = -1) -> bytes:
            if self.tell() > 0:
                raise OSError(5, "Input/output error")
            return super().read(100)

    with pytest.raises(OSError, match="Input/output error"):
        list(json_lines(json_stream(Failing(packed), "events.jsonl.gz")))


def test_a_file_that_expands_a_thousandfold_is_read_in_bounded_memory() -> None:
    expanded = 64 << 20
    packed = gzip.compress(b"x" * expanded + b"\n" + ROWS, compresslevel=9)
    assert len(packed) < expanded // 500
    tracemalloc.start()
    try:
        lines = _lines(packed)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(lines) == 2_001 and len(lines[0]) < expanded  # the long row is cut
    assert peak < 48 << 20, peak


def test_a_micro_batch_budgets_a_gzipd_file_by_its_size_decompressed(
        tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl.gz"
    path.write_bytes(gzip.compress(ROWS))
    assert input_bytes(path) == len(ROWS)
    (tmp_path / "cut.jsonl.gz").write_bytes(b"\x1f\x8b")
    assert input_bytes(tmp_path / "cut.jsonl.gz") == 2  # too short to have a trailer


def test_the_engines_read_a_gzipd_log_as_the_same_log_uncompressed(tmp_path: Path) -> None:
    from tickwheel.pipeline.tools.generator import GeneratorConfig, write_event_log

    plain, packed = tmp_path / "plain", tmp_path / "packed"
    write_event_log(GeneratorConfig(events=3_000, rows_per_file=1_000, seed=5,
                                    malformed_fraction=0.05), plain)
    packed.mkdir()
    for n, path in enumerate(sorted(plain.iterdir())):
        data = path.read_bytes()
        if n % 2 == 0:
            (packed / f"{path.name}.gz").write_bytes(gzip.compress(data))
        else:
            (packed / path.name).write_bytes(data)
    assert list(read_events(packed)) == list(read_events(plain))


def test_the_generator_writes_a_gzipd_log_that_reads_as_its_plain_one(tmp_path: Path) -> None:
    from tickwheel.pipeline.tools.generator import GeneratorConfig, write_event_log

    config = GeneratorConfig(events=3_000, rows_per_file=1_000, seed=9,
                             malformed_fraction=0.05)
    write_event_log(config, tmp_path / "plain")
    write_event_log(config, tmp_path / "packed", gzip=True)
    write_event_log(config, tmp_path / "again", gzip=True)
    names = sorted(p.name for p in (tmp_path / "packed").iterdir())
    assert names == [f"events-0000{n}.jsonl.gz" for n in range(1, 5)]
    assert list(read_events(tmp_path / "packed")) == list(read_events(tmp_path / "plain"))
    # The same seed, the same bytes: no time stamp in the gzip header.
    assert all((tmp_path / "packed" / n).read_bytes() == (tmp_path / "again" / n).read_bytes()
               for n in names)


def test_a_live_workload_can_land_gzipd_files(tmp_path: Path) -> None:
    import threading

    from tickwheel.pipeline.tools.generator import GeneratorConfig, follow_event_log

    stop = threading.Event()
    ticks = itertools.count(1_700_000_000_000, 250)  # a clock that never makes it wait
    landed: list[int] = []

    def on_file(rows: int, behind_ms: int) -> None:
        landed.append(rows)
        if len(landed) == 3:
            stop.set()

    counts = follow_event_log(GeneratorConfig(seed=3), tmp_path, 2_000, stop, file_ms=100,
                              clock=lambda: next(ticks), on_file=on_file, gzip=True)
    files = sorted(tmp_path.iterdir())
    assert files and all(f.name.endswith(".jsonl.gz") for f in files)
    rows = list(read_events(tmp_path))
    assert len(rows) == counts["rows"] == sum(landed) > 0
    assert not any(isinstance(row, Quarantined) for row in rows)
