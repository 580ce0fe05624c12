"""The submit API: what it takes, what it refuses, and that an answer means durable."""

from __future__ import annotations

import errno
import json
import os
import socket
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest

pytest.importorskip("aiohttp")

from tests.conftest import eventually
from tests.service.conftest import FakeEngine, landed_rows
from tickwheel.pipeline.contract.events import Wire, compact_wire, parse_wire
from tickwheel.pipeline.engines import feed as feed_module
from tickwheel.pipeline.engines.feed import FileStat, IntakeFeed
from tickwheel.pipeline.engines.following import wall_clock_ms
from tickwheel.service import intake as intake_module
from tickwheel.service import server as server_module
from tickwheel.service.journal import Receipt, Submission, SubmitJournal
from tickwheel.service.server import SubmitServer, parse_listen

FAR = 99_999_999_999_999


def watch(op_id: str, **extra: object) -> dict[str, object]:
    return {"type": "watch", "op_id": op_id, "keys": [], "condition": "none",
            "deadline_ms": FAR, **extra}


class ManualClock:
    def __init__(self, now: int) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(1_000_000)


@pytest.fixture
def server(tmp_path: Path, clock: ManualClock) -> Iterator[SubmitServer]:
    with SubmitServer(tmp_path / "in", tmp_path / "state", clock=clock) as running:
        yield running


def post(server: SubmitServer, body: bytes | str, **headers: str) -> httpx.Response:
    data = body.encode() if isinstance(body, str) else body
    return httpx.post(f"{server.url}/v1/events", content=data, headers=headers, timeout=10)


# -- what it takes --------------------------------------------------------------


def test_one_row_an_array_and_json_lines_are_taken(server: SubmitServer) -> None:
    assert post(server, json.dumps(watch("a"))).status_code == 200
    assert post(server, json.dumps([watch("b"), watch("c")])).status_code == 200
    answer = post(server, f"{json.dumps(watch('d'))}\n\n{json.dumps(watch('e'))}\n")
    assert answer.status_code == 200 and answer.json()["accepted"] == 2
    assert [r["op_id"] for r in landed_rows(server.input_dir)] == list("abcde")


def test_json_lines_end_where_the_engines_end_them(server: SubmitServer) -> None:
    # A JSON string may hold U+2028 (a line break to str.splitlines, not to a log
    # reader); \r\n ends a line; a byte order mark before the first row is left out.
    odd = json.dumps(watch("a\u2028b"), ensure_ascii=False)
    body = "\ufeff" + odd + "\r\n" + json.dumps(watch("c")) + "\r\n"
    answer = post(server, body.encode())
    assert answer.status_code == 200 and answer.json()["accepted"] == 2
    assert [r["op_id"] for r in landed_rows(server.input_dir)] == ["a\u2028b", "c"]


def test_an_engine_alongside_is_handed_the_rows_as_it_would_parse_the_file(
        tmp_path: Path, clock: ManualClock) -> None:
    handed: list[tuple[str, list[Wire], FileStat]] = []

    class Recording(IntakeFeed):
        def offer(self, name: str, rows: list[Wire], stat: FileStat) -> None:
            handed.append((name, rows, stat))

    with SubmitServer(tmp_path / "in", tmp_path / "state",
                      feed=Recording(clock)) as server:
        post(server, "\n".join(json.dumps(r) for r in [watch("a"), watch("b", ts_ms=5)]))
        post(server, json.dumps([{"type": "cancel", "op_id": "a"}]))
    assert len(handed) == 2
    for name, rows, stat in handed:
        path = server.input_dir / name
        assert rows == [compact_wire(line) for line in path.read_text().splitlines()]
        assert stat == FileStat.of(path)


def test_an_answer_names_the_file_that_holds_the_rows_on_disk(server: SubmitServer) -> None:
    answer = post(server, json.dumps([watch("a"), {"type": "cancel", "op_id": "a"}])).json()
    path = server.input_dir / answer["file"]
    lines = path.read_text().splitlines()
    assert len(lines) == 2 and all(len(parse_wire(line)) == 14 for line in lines)
    assert not [p for p in server.input_dir.iterdir() if p.name.startswith(".")]


def test_a_row_without_ts_ms_gets_the_server_clock(server: SubmitServer,
                                                   clock: ManualClock) -> None:
    post(server, json.dumps([watch("a"), watch("b", ts_ms=5)]))
    assert [r["ts_ms"] for r in landed_rows(server.input_dir)] == [1_000_000, 5]


def test_the_server_never_hands_out_a_time_below_one_it_gave(server: SubmitServer,
                                                            clock: ManualClock) -> None:
    post(server, json.dumps(watch("a")))
    clock.now -= 60_000  # the wall clock steps back a minute
    answer = post(server, json.dumps(watch("b"))).json()
    assert answer["ts_ms"] == 1_000_000
    assert [r["ts_ms"] for r in landed_rows(server.input_dir)] == [1_000_000, 1_000_000]


def test_times_stay_monotonic_across_a_restart(tmp_path: Path, clock: ManualClock) -> None:
    with SubmitServer(tmp_path / "in", tmp_path / "state", clock=clock) as server:
        post(server, json.dumps(watch("a")))
    clock.now -= 60_000  # stepped back while the service was down
    with SubmitServer(tmp_path / "in", tmp_path / "state", clock=clock) as server:
        assert post(server, json.dumps(watch("b"))).json()["ts_ms"] == 1_000_000


def test_file_names_only_grow_even_when_the_clock_steps_back(server: SubmitServer,
                                                            clock: ManualClock) -> None:
    names = []
    for i in range(3):
        names.append(post(server, json.dumps(watch(f"op{i}"))).json()["file"])
        clock.now -= 1_000
    assert names == sorted(names) and len(set(names)) == 3


class _HeldDisk(SubmitJournal):
    """A journal whose next commit waits until the test lets it land."""

    entered: threading.Event
    release: threading.Event

    def land(self, batch: Sequence[Submission]) -> list[Receipt]:
        self.entered.set()
        assert self.release.wait(30)
        return super().land(batch)


def test_a_request_being_written_holds_the_time_floor(tmp_path: Path,
                                                      clock: ManualClock) -> None:
    with SubmitServer(tmp_path / "in", tmp_path / "state", clock=clock) as server:
        assert server.feed.time_floor() == 1_000_000  # idle: the next stamp's least time
        held = _HeldDisk(tmp_path / "in", tmp_path / "state2", clock=clock)
        held.entered, held.release = threading.Event(), threading.Event()
        server.journal = held
        answers: list[httpx.Response] = []
        sender = threading.Thread(target=lambda: answers.append(
            post(server, json.dumps(watch("a")))))
        sender.start()
        assert held.entered.wait(30)
        clock.now += 60_000  # a minute passes while the commit is stuck
        assert server.feed.time_floor() == 1_000_000  # the row's stamp: time must wait for it
        stats = server.stats()
        assert (stats.writing_requests, stats.floor_lag_ms) == (1, 60_000)
        held.release.set()
        sender.join()
        assert answers[0].json()["ts_ms"] == 1_000_000
        assert server.feed.time_floor() == 1_060_000  # landed: the engine lists it
        stats = server.stats()
        assert (stats.writing_requests, stats.floor_lag_ms) == (0, 0)


def test_the_time_a_request_waits_and_a_commit_lands_is_measured(tmp_path: Path,
                                                                 clock: ManualClock) -> None:
    with SubmitServer(tmp_path / "in", tmp_path / "state", clock=clock) as server:
        held = _HeldDisk(tmp_path / "in", tmp_path / "state2", clock=clock)
        held.entered, held.release = threading.Event(), threading.Event()
        server.journal = held
        sender = threading.Thread(target=lambda: post(server, json.dumps(watch("a"))))
        sender.start()
        assert held.entered.wait(30)
        time.sleep(0.06)  # the commit is stuck this long, so it is what is measured
        held.release.set()
        sender.join()
        assert post(server, "this is not JSON").status_code == 400  # refused: not timed
        stats = server.stats()
        assert (stats.ack_ms.count, stats.commit_wait_ms.count, stats.land_ms.count) == (1, 1, 1)
        assert stats.land_ms.maximum >= 55 and stats.ack_ms.maximum >= stats.land_ms.maximum
        assert stats.commit_wait_ms.maximum < stats.land_ms.maximum  # the hold is the land's
        status = httpx.get(f"{server.url}/v1/status").json()["intake"]
        assert status["land_ms"]["count"] == 1 and status["land_ms"]["max"] >= 55
        assert set(status["ack_ms"]) == {"count", "mean", "p50", "p99", "max"}


def test_a_commit_lands_on_the_loops_thread(server: SubmitServer) -> None:
    # A writer thread would wait for the interpreter's lock after each syscall of the
    # landing (docs/service.md): the commit runs where the requests are read.
    threads: list[str] = []
    land = server.journal.land

    def recording(batch: Sequence[Submission]) -> list[Receipt]:
        threads.append(threading.current_thread().name)
        return land(batch)

    server.journal.land = recording  # type: ignore[method-assign]
    assert post(server, json.dumps(watch("a"))).status_code == 200
    assert threads == ["tickwheel-submit-server"]


def test_an_engine_gives_way_to_the_loop_only_while_requests_come(
        server: SubmitServer, monkeypatch: pytest.MonkeyPatch) -> None:
    # An engine catching up with no one asking runs on; any request, a read too, makes
    # the loop busy for BUSY_FOR_S, set here so that no timing decides the answers.
    monkeypatch.setattr(feed_module, "BUSY_FOR_S", 3_600.0)
    feed = server.feed
    assert feed.give_way() is False
    assert httpx.get(f"{server.url}/v1/status").status_code == 200
    assert feed.give_way() is True
    feed.give_way_s = 0.0
    assert feed.give_way() is False
    feed.give_way_s = feed_module.GIVE_WAY_S
    monkeypatch.setattr(feed_module, "BUSY_FOR_S", 0.0)
    assert feed.give_way() is False  # the request is older than that


def test_a_clock_beside_a_feed_is_refused(tmp_path: Path, clock: ManualClock) -> None:
    # The feed stamps with its own clock: a second one would be silently ignored.
    with pytest.raises(ValueError, match="clock or feed"):
        SubmitServer(tmp_path / "in", tmp_path / "state", clock=clock,
                     feed=IntakeFeed(clock))


@pytest.mark.parametrize("give_way_s", [-0.001, 1.5, float("nan")])
def test_a_give_way_time_outside_0_to_1_s_is_refused(give_way_s: float) -> None:
    with pytest.raises(ValueError, match="give_way_s"):
        IntakeFeed(wall_clock_ms, give_way_s=give_way_s)


def test_a_refused_request_holds_no_floor(server: SubmitServer, clock: ManualClock) -> None:
    assert post(server, json.dumps({"type": "nope"})).status_code == 400
    clock.now += 5_000
    assert server.feed.time_floor() == 1_005_000


def test_stamps_start_at_the_engines_time(tmp_path: Path, clock: ManualClock) -> None:
    with SubmitServer(tmp_path / "in", tmp_path / "state", clock=clock,
                      min_stamp_ms=2_000_000) as server:  # a checkpoint ahead of the clock
        assert post(server, json.dumps(watch("a"))).json()["ts_ms"] == 2_000_000


def test_the_floor_is_written_for_an_engine_in_another_process(tmp_path: Path,
                                                              clock: ManualClock) -> None:
    floor = tmp_path / "state" / "floor"
    with SubmitServer(tmp_path / "in", tmp_path / "state",
                      feed=IntakeFeed(clock, floor_file=floor)):
        assert floor.read_text() == "1000000\n"  # there before any request is taken
        clock.now += 1_000
        assert eventually(lambda: floor.read_text() == "1001000\n", 10)


def test_concurrent_requests_share_a_group_commit(tmp_path: Path, clock: ManualClock) -> None:
    with SubmitServer(tmp_path / "in", tmp_path / "state", clock=clock,
                      commit_interval_ms=200) as server:
        post(server, json.dumps(watch("first")))  # the next commit waits out the interval
        answers: list[httpx.Response] = []
        threads = [threading.Thread(target=lambda i=i: answers.append(
            post(server, json.dumps(watch(f"op{i}"))))) for i in range(20)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert {a.status_code for a in answers} == {200}
        assert len({a.json()["file"] for a in answers}) < 20
        assert server.stats().accepted_rows == 21


# -- what it refuses -------------------------------------------------------------


@pytest.mark.parametrize(("row", "reason"), [
    ({"type": "watch", "op_id": "a"}, "missing_field"),
    ({"type": "nope"}, "unknown_type"),
    (watch("a", condition="sometimes"), "unknown_condition"),
    (watch("a", keys=["k"]), "bad_keys"),
    ({"type": "update", "key": "k", "value": 1, "error": "e"}, "value_and_error"),
    (watch("a", ts_ms="soon"), "bad_type"),
    ([1, 2], "unparseable"),
])
def test_a_row_an_engine_would_quarantine_refuses_the_request(
        server: SubmitServer, row: object, reason: str) -> None:
    answer = post(server, json.dumps([watch("fine"), row]))
    assert answer.status_code == 400
    assert answer.json()["refused"] == [
        {"index": 1, "reason": reason, "row": answer.json()["refused"][0]["row"]}]
    assert landed_rows(server.input_dir) == []  # not even the good row


def test_a_row_that_names_a_field_twice_is_refused(server: SubmitServer) -> None:
    answer = post(server, '{"type":"cancel","op_id":"a","op_id":"b"}')
    assert answer.status_code == 400
    assert answer.json()["refused"][0]["reason"] == "duplicate_field"


def test_a_body_that_is_not_json_is_refused_with_the_line(server: SubmitServer) -> None:
    answer = post(server, json.dumps(watch("a")) + "\n{oops\n")
    assert answer.status_code == 400
    assert answer.json()["refused"] == [{"index": 1, "reason": "unparseable",
                                         "row": "{oops"}]
    assert post(server, b"\xff\xfe").status_code == 400
    assert post(server, b"  ").status_code == 400


def test_hostile_bodies_are_refused_not_crashed_on(server: SubmitServer) -> None:
    deep = post(server, b"[" * 200_000 + b"]" * 200_000)
    assert deep.status_code == 400 and "nested too deep" in deep.json()["error"]
    deep_row = post(server, b'{"a":' * 100_000 + b"1" + b"}" * 100_000)
    assert deep_row.json()["refused"][0]["reason"] == "unparseable"
    huge = post(server, '{"ts_ms": 1180591620717411303424, "type": "tick"}')
    assert huge.json()["refused"][0]["reason"] == "bad_type"
    assert landed_rows(server.input_dir) == []


def test_a_lone_surrogate_in_an_array_row_is_written_faithfully(server: SubmitServer,
                                                                clock: ManualClock) -> None:
    # Valid JSON that no UTF-8 file holds raw: escaped as it came, as JSON Lines keep it.
    answer = post(server, '[{"type":"tick","junk":"\\ud800"}]')
    assert answer.status_code == 200
    (landed,) = server.input_dir.glob("submit-*.jsonl")
    assert "\\ud800" in landed.read_text()
    assert landed_rows(server.input_dir) == [{"ts_ms": clock.now, "type": "tick",
                                              "junk": "\ud800"}]
    assert post(server, json.dumps(watch("after"))).status_code == 200


def test_a_deeply_nested_array_row_is_written_whole(server: SubmitServer) -> None:
    deep = '[{"type":"tick","a":' + "[" * 900 + "]" * 900 + "}]"
    assert post(server, deep).status_code == 200
    (row,) = landed_rows(server.input_dir)
    assert json.dumps(row["a"]) == json.dumps(json.loads(deep)[0]["a"])


def test_a_row_too_deep_to_write_is_refused_and_lets_go_of_its_stamp(
        server: SubmitServer, clock: ManualClock, monkeypatch: pytest.MonkeyPatch) -> None:
    def too_deep(row: object) -> str:
        raise RecursionError("maximum recursion depth exceeded")

    monkeypatch.setattr(intake_module, "_dumps", too_deep)
    answer = post(server, '[{"type":"tick","a":[[[]]]}]')
    assert answer.status_code == 400
    assert answer.json()["refused"][0]["reason"] == "unparseable"
    clock.now += 1_000
    assert server.stats().writing_requests == 0
    assert server.feed.time_floor() == clock.now  # time goes on
    assert landed_rows(server.input_dir) == []


def test_any_fault_while_reading_a_request_lets_go_of_its_stamp(
        server: SubmitServer, clock: ManualClock, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args: object, **kwargs: object) -> object:
        raise RuntimeError("a fault of the server's own")

    monkeypatch.setattr(server_module, "read_parsed_rows", broken)
    assert post(server, json.dumps(watch("a"))).status_code == 500
    clock.now += 1_000
    assert server.stats().writing_requests == 0
    assert server.feed.time_floor() == clock.now
    monkeypatch.undo()
    assert post(server, json.dumps(watch("a"))).status_code == 200


def test_an_empty_array_is_refused_and_lands_no_file(server: SubmitServer) -> None:
    for body in ("[]", " [ ] ", "{}"):
        answer = post(server, body)
        assert answer.status_code == 400, body
    assert post(server, "[]").json()["error"] == "the body holds no rows"
    assert list(server.input_dir.iterdir()) == []


class _Broken(SubmitJournal):
    def land(self, batch: object) -> object:  # type: ignore[override]
        raise ValueError("a fault in the commit, not the disk")


def test_a_commit_that_fails_answers_500_and_the_loop_goes_on(tmp_path: Path,
                                                              clock: ManualClock) -> None:
    with SubmitServer(tmp_path / "in", tmp_path / "state", clock=clock) as server:
        working = server.journal
        server.journal = _Broken(tmp_path / "in", tmp_path / "state2", clock=clock)
        answer = post(server, json.dumps(watch("a")), **{"Idempotency-Key": "k-1"})
        assert answer.status_code == 500 and "nothing of them" in answer.json()["error"]
        clock.now += 1_000
        assert server.feed.time_floor() == clock.now  # its stamp let go
        server.journal = working
        answer = post(server, json.dumps(watch("a")), **{"Idempotency-Key": "k-1"})
        assert answer.status_code == 200 and "Idempotent-Replayed" not in answer.headers
        assert [r["op_id"] for r in landed_rows(server.input_dir)] == ["a"]


def test_a_row_ahead_of_the_future_bound_is_refused(tmp_path: Path,
                                                    clock: ManualClock) -> None:
    with SubmitServer(tmp_path / "in", tmp_path / "state", clock=clock,
                      max_future_ms=1_000) as server:
        assert post(server, json.dumps(watch("a", ts_ms=clock.now + 1_000))).status_code == 200
        answer = post(server, json.dumps(watch("b", ts_ms=clock.now + 1_001)))
        assert answer.json()["refused"][0]["reason"] == "future"


def test_a_huge_body_is_refused_with_413_unwritten(tmp_path: Path, clock: ManualClock) -> None:
    with SubmitServer(tmp_path / "in", tmp_path / "state", clock=clock,
                      max_body_bytes=10_000) as server:
        rows = "".join(json.dumps(watch(f"op{i}")) + "\n" for i in range(200))
        assert post(server, rows).status_code == 413

        def chunks() -> Iterator[bytes]:  # no content-length: the limit holds while read
            yield rows.encode()

        answer = httpx.post(f"{server.url}/v1/events", content=chunks(), timeout=10)
        assert answer.status_code == 413
        assert server.stats().refused_too_large == 2
        assert landed_rows(server.input_dir) == []


def test_a_slow_client_does_not_hold_up_the_others(server: SubmitServer) -> None:
    slow = socket.create_connection(("127.0.0.1", server.port))
    try:
        slow.sendall(b"POST /v1/events HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{")
        started = time.monotonic()
        for i in range(5):
            assert post(server, json.dumps(watch(f"op{i}"))).status_code == 200
        assert time.monotonic() - started < 5
    finally:
        slow.close()
    assert len(landed_rows(server.input_dir)) == 5


# -- retries ---------------------------------------------------------------------


def test_a_retried_key_is_answered_again_and_not_written_again(server: SubmitServer) -> None:
    body = json.dumps(watch("a"))
    first = post(server, body, **{"Idempotency-Key": "k-1"})
    again = post(server, body, **{"Idempotency-Key": "k-1"})
    assert again.status_code == 200 and again.json() == first.json()
    assert again.headers["Idempotent-Replayed"] == "true"
    assert len(landed_rows(server.input_dir)) == 1
    assert server.stats().replayed == 1


def test_a_key_sent_with_another_body_is_refused(server: SubmitServer) -> None:
    post(server, json.dumps(watch("a")), **{"Idempotency-Key": "k-1"})
    answer = post(server, json.dumps(watch("b")), **{"Idempotency-Key": "k-1"})
    assert answer.status_code == 422
    assert [r["op_id"] for r in landed_rows(server.input_dir)] == ["a"]


def test_a_malformed_key_is_refused(server: SubmitServer) -> None:
    answer = post(server, json.dumps(watch("a")), **{"Idempotency-Key": "x" * 256})
    assert answer.status_code == 400


def test_keys_outlive_a_restart(tmp_path: Path, clock: ManualClock) -> None:
    body = json.dumps(watch("a"))
    with SubmitServer(tmp_path / "in", tmp_path / "state", clock=clock) as server:
        first = post(server, body, **{"Idempotency-Key": "k-1"}).json()
    with SubmitServer(tmp_path / "in", tmp_path / "state", clock=clock) as server:
        again = post(server, body, **{"Idempotency-Key": "k-1"})
        assert again.json() == first and again.headers["Idempotent-Replayed"] == "true"
        assert len(landed_rows(server.input_dir)) == 1


def test_keys_expire_after_their_ttl(tmp_path: Path, clock: ManualClock) -> None:
    with SubmitServer(tmp_path / "in", tmp_path / "state", clock=clock,
                      key_ttl_ms=1_000) as server:
        post(server, json.dumps(watch("a")), **{"Idempotency-Key": "k-1"})
        clock.now += 1_001
        assert "Idempotent-Replayed" not in post(
            server, json.dumps(watch("a")), **{"Idempotency-Key": "k-1"}).headers
        assert len(landed_rows(server.input_dir)) == 2


def test_a_key_whose_file_never_landed_is_forgotten(tmp_path: Path,
                                                    clock: ManualClock) -> None:
    # A crash between the key's record and its file: the last record names a file
    # that is not there, and nothing of it was answered.
    journal = SubmitJournal(tmp_path / "in", tmp_path / "state", clock=clock)
    journal.land([Submission(['{"ts_ms":1,"type":"tick"}'], "k-1", "d1", 1)])
    journal.land([Submission(['{"ts_ms":2,"type":"tick"}'], "k-2", "d2", 2)])
    journal.close()
    last = sorted((tmp_path / "in").glob("submit-*.jsonl"))[-1]
    last.unlink()
    reopened = SubmitJournal(tmp_path / "in", tmp_path / "state", clock=clock)
    assert reopened.replay("k-1") is not None and reopened.replay("k-2") is None


def test_a_torn_last_record_is_dropped(tmp_path: Path, clock: ManualClock) -> None:
    journal = SubmitJournal(tmp_path / "in", tmp_path / "state", clock=clock)
    journal.land([Submission(['{"ts_ms":1,"type":"tick"}'], "k-1", "d1", 1)])
    journal.close()
    newest = key_segments(tmp_path / "state")[-1]
    with newest.open("ab") as keys:
        keys.write(b'{"file":"submit-')
    reopened = SubmitJournal(tmp_path / "in", tmp_path / "state", clock=clock)
    assert reopened.replay("k-1") is not None
    assert newest.read_bytes().endswith(b"]]}\n")  # cut off, durably, before the next
    reopened.land([Submission(['{"ts_ms":2,"type":"tick"}'], "k-2", "d2", 2)])
    reopened.close()
    again = SubmitJournal(tmp_path / "in", tmp_path / "state", clock=clock)
    assert again.replay("k-1") is not None and again.replay("k-2") is not None


def key_segments(state: Path) -> list[Path]:
    return sorted(state.glob("keys-*.jsonl"))


def test_a_commit_is_durable_before_it_is_answered(tmp_path: Path, clock: ManualClock,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    # The keys' segment, then the file: each opened with O_DSYNC (a write is synced as
    # it returns) or fsync'd; then the directory's entry for the file.
    dsync = getattr(os, "O_DSYNC", 0)
    names: dict[int, str] = {}  # of the descriptors open
    opened: list[str] = []
    synced: set[str] = set()  # opened with O_DSYNC
    events: list[str] = []
    real_open, real_write, real_fsync = os.open, os.write, os.fsync

    def opening(path: Any, flags: int, *args: Any) -> int:
        fd = real_open(path, flags, *args)
        names[fd] = Path(path).name
        opened.append(names[fd])
        if flags & dsync:
            synced.add(names[fd])
        return fd

    def writing(fd: int, data: Any) -> int:
        events.append(f"write {names[fd]}")
        return real_write(fd, data)

    def syncing(fd: int) -> None:
        events.append(f"fsync {names[fd]}")
        real_fsync(fd)

    monkeypatch.setattr(os, "open", opening)
    monkeypatch.setattr(os, "write", writing)
    monkeypatch.setattr(os, "fsync", syncing)
    journal = SubmitJournal(tmp_path / "in", tmp_path / "state", clock=clock)
    events.clear()
    [receipt] = journal.land([Submission(['{"ts_ms":1,"type":"tick"}'], "k-1", "d", 1)])
    monkeypatch.undo()
    journal.close()
    segment = key_segments(tmp_path / "state")[-1].name
    temporary = next(name for name in opened if name.startswith(f".{receipt.file}."))
    for name in (segment, temporary):
        assert name in synced or f"fsync {name}" in events
    # A key is on disk before its file can be: a crash between them leaves a key whose
    # file never landed, which a start forgets, never a file whose key is lost.
    assert events.index(f"write {temporary}") > max(
        i for i, event in enumerate(events) if event == f"write {segment}")
    assert events[-1] == "fsync in"  # the directory, once the file is in place


def test_the_key_log_closes_segments_and_drops_those_whose_keys_are_all_forgotten(
        tmp_path: Path, clock: ManualClock) -> None:
    journal = SubmitJournal(tmp_path / "in", tmp_path / "state", clock=clock, max_keys=4,
                            key_segment_bytes=200)
    for i in range(12):
        journal.land([Submission([f'{{"ts_ms":{i},"type":"tick"}}'], f"k-{i}", "d", i)])
    segments = key_segments(tmp_path / "state")
    # The newest four keys are kept, in at most three segments (two records each, and
    # the open one); every segment before them went, none was rewritten.
    assert [journal.replay(f"k-{i}") is not None for i in range(12)] == [False] * 8 + [True] * 4
    assert 2 <= len(segments) <= 3
    journal.close()
    reopened = SubmitJournal(tmp_path / "in", tmp_path / "state", clock=clock, max_keys=4,
                             key_segment_bytes=200)
    assert [reopened.replay(f"k-{i}") is not None for i in range(12)] == [False] * 8 + [True] * 4
    reopened.close()
    for _ in range(3):  # a start opens a segment; an empty one goes at the next start
        SubmitJournal(tmp_path / "in", tmp_path / "state", clock=clock, max_keys=4).close()
    assert len(key_segments(tmp_path / "state")) <= len(segments) + 1


def test_keys_past_their_ttl_take_their_segments_with_them(tmp_path: Path,
                                                           clock: ManualClock) -> None:
    journal = SubmitJournal(tmp_path / "in", tmp_path / "state", clock=clock,
                            key_ttl_ms=1_000, key_segment_bytes=1)
    journal.land([Submission(['{"ts_ms":1,"type":"tick"}'], "k-1", "d", 1)])
    first = key_segments(tmp_path / "state")[0]
    clock.now += 1_001
    journal.land([Submission(['{"ts_ms":2,"type":"tick"}'], "k-2", "d", 2)])
    assert journal.replay("k-1") is None and journal.replay("k-2") is not None
    assert not first.exists()
    journal.close()


def test_kept_keys_give_the_garbage_collector_nothing_to_walk(tmp_path: Path,
                                                             clock: ManualClock) -> None:
    import gc

    journal = SubmitJournal(tmp_path / "in", tmp_path / "state", clock=clock)
    gc.collect()
    before = len(gc.get_objects())
    for i in range(50):
        journal.land([Submission([f'{{"ts_ms":{i},"type":"tick"}}'], f"k-{i}-{j}", "d", i)
                      for j in range(100)])
    gc.collect()
    assert len(gc.get_objects()) - before < 500  # 5,000 keys kept
    replayed = journal.replay("k-49-99")
    assert replayed is not None and replayed[0] == "d"
    assert replayed[1] == Receipt(replayed[1].file, 1, 49)
    journal.close()


def test_a_key_file_in_another_layout_is_refused_as_other_formats_are(
        tmp_path: Path, clock: ManualClock) -> None:
    journal = SubmitJournal(tmp_path / "in", tmp_path / "state", clock=clock)
    journal.land([Submission(['{"ts_ms":1,"type":"tick"}'], "k-1", "d1", 1)])
    journal.close()
    [segment] = key_segments(tmp_path / "state")
    segment.rename(tmp_path / "state" / "keys.jsonl")
    with pytest.raises(ValueError, match=r"keys\.jsonl: a key file in a layout"):
        SubmitJournal(tmp_path / "in", tmp_path / "state", clock=clock)


def test_a_symlink_among_the_key_segments_is_refused(tmp_path: Path,
                                                     clock: ManualClock) -> None:
    SubmitJournal(tmp_path / "in", tmp_path / "state", clock=clock).close()
    outside = tmp_path / "outside.jsonl"
    outside.write_text('{"file":"submit-0000000000001-000000.jsonl","at":1,"keys":[]}\n')
    (tmp_path / "state" / "keys-000000007.jsonl").symlink_to(outside)
    with pytest.raises(ValueError, match="not a key segment"):
        SubmitJournal(tmp_path / "in", tmp_path / "state", clock=clock)


def test_stale_temporaries_of_a_crashed_commit_are_removed(tmp_path: Path,
                                                           clock: ManualClock) -> None:
    (tmp_path / "in").mkdir()
    stale = tmp_path / "in" / ".submit-0000000000001-000000.jsonl.0123abcd.tmp"
    stale.write_text("half")
    other = tmp_path / "in" / ".someone-elses.tmp"
    other.write_text("kept")
    SubmitJournal(tmp_path / "in", tmp_path / "state", clock=clock).close()
    assert not stale.exists() and other.exists()


# -- retiring what the engine committed ------------------------------------------


def _land(journal: SubmitJournal, n: int, key: str | None = None) -> list[str]:
    return [journal.land([Submission([f'{{"ts_ms":{i},"type":"tick"}}'],
                                     None if key is None else f"{key}-{i}", f"d{i}", i)])[0].file
            for i in range(n)]


def test_files_the_engine_committed_are_retired_all_but_the_newest(
        tmp_path: Path, clock: ManualClock) -> None:
    journal = SubmitJournal(tmp_path / "in", tmp_path / "state", clock=clock)
    names = _land(journal, 4)
    asked: list[list[str]] = []

    def everything(candidates: Sequence[str]) -> list[str]:
        asked.append(list(candidates))
        return list(candidates)

    assert journal.retire(everything) == 3
    assert asked == [names[:3]]  # the newest is never offered
    assert sorted(p.name for p in (tmp_path / "in").iterdir()) == names[3:]
    stats = journal.stats()
    assert (stats.retired, stats.unretired) == (3, 1)
    more = _land(journal, 1)
    assert journal.retire(everything) == 1  # the one kept goes once a newer one landed
    assert [p.name for p in (tmp_path / "in").iterdir()] == more


def test_retiring_stops_at_the_first_file_not_committed(tmp_path: Path,
                                                        clock: ManualClock) -> None:
    journal = SubmitJournal(tmp_path / "in", tmp_path / "state", clock=clock)
    names = _land(journal, 4)
    assert journal.retire(lambda candidates: [names[0], names[2]]) == 1
    assert sorted(p.name for p in (tmp_path / "in").iterdir()) == names[1:]
    assert journal.retire(lambda candidates: []) == 0


def test_a_file_that_cannot_be_deleted_is_retired_at_a_later_round(
        tmp_path: Path, clock: ManualClock) -> None:
    journal = SubmitJournal(tmp_path / "in", tmp_path / "state", clock=clock)
    names = _land(journal, 4)
    taken = journal.take_retired(list)
    assert taken == names[:3]
    assert journal.stats().unretired == 4  # counted until they are gone
    (tmp_path / "in" / names[1]).unlink()
    (tmp_path / "in" / names[1]).mkdir()  # unlink() fails on it
    with pytest.raises(OSError):
        journal.delete_retired(taken)
    assert journal.stats().unretired == 3  # the two not deleted wait for the next round
    (tmp_path / "in" / names[1]).rmdir()
    assert journal.retire(list) == 2
    assert [p.name for p in (tmp_path / "in").iterdir()] == names[3:]
    assert (journal.stats().retired, journal.stats().unretired) == (3, 1)


def test_the_server_deletes_retired_files_off_its_loops_thread(
        tmp_path: Path, clock: ManualClock) -> None:
    # Each unlink gives up the interpreter's lock; on the loop, winning it back from a
    # busy engine would hold up the requests (docs/service.md).
    engine = FakeEngine(tmp_path / "in")
    committed = engine.committed
    with SubmitServer(tmp_path / "in", tmp_path / "state", clock=clock, engine=engine,
                      retire_interval_s=0.01) as server:
        threads: list[str] = []
        delete = server.journal.delete_retired

        def recording(names: Sequence[str]) -> int:
            threads.append(threading.current_thread().name)
            return delete(names)

        server.journal.delete_retired = recording  # type: ignore[method-assign]
        files = [post(server, json.dumps(watch(f"a{i}"))).json()["file"] for i in range(2)]
        committed.update(files)
        assert eventually(lambda: server.stats().retired_files == 1)
    assert threads and "tickwheel-submit-server" not in threads


def test_files_landed_before_a_restart_are_retired_after_it(tmp_path: Path,
                                                            clock: ManualClock) -> None:
    journal = SubmitJournal(tmp_path / "in", tmp_path / "state", clock=clock)
    names = _land(journal, 3)
    journal.close()
    (tmp_path / "in" / "user-file.jsonl").write_text("")
    reopened = SubmitJournal(tmp_path / "in", tmp_path / "state", clock=clock)
    assert reopened.retire(list) == 2
    assert sorted(p.name for p in (tmp_path / "in").iterdir()) == [names[2], "user-file.jsonl"]


def test_a_key_whose_file_was_retired_is_answered_after_a_restart(
        tmp_path: Path, clock: ManualClock) -> None:
    journal = SubmitJournal(tmp_path / "in", tmp_path / "state", clock=clock)
    keyed = _land(journal, 2, key="k")
    _land(journal, 1)  # unkeyed: the journal's last record names a file before it
    journal.retire(list)
    assert not (tmp_path / "in" / keyed[1]).exists()
    journal.close()
    reopened = SubmitJournal(tmp_path / "in", tmp_path / "state", clock=clock)
    replayed = reopened.replay("k-1")
    assert replayed is not None and replayed[1].file == keyed[1]


def test_the_server_retires_what_the_engine_committed(tmp_path: Path,
                                                      clock: ManualClock) -> None:
    engine = FakeEngine(tmp_path / "in")
    committed = engine.committed
    with SubmitServer(tmp_path / "in", tmp_path / "state", clock=clock, engine=engine,
                      retire_interval_s=0.01) as server:
        files = [post(server, json.dumps(watch(f"a{i}"))).json()["file"] for i in range(3)]
        assert server.stats().unretired_files == 3
        committed.update(files[:1])
        assert eventually(lambda: server.stats().retired_files == 1)
        assert sorted(p.name for p in server.input_dir.iterdir()) == files[1:]
        status = httpx.get(f"{server.url}/v1/status").json()["intake"]
        assert (status["retired_files"], status["unretired_files"]) == (1, 2)


# -- back-pressure ---------------------------------------------------------------


def test_an_engine_behind_gets_503_with_retry_after(tmp_path: Path,
                                                    clock: ManualClock) -> None:
    engine = FakeEngine(tmp_path / "in")
    with SubmitServer(tmp_path / "in", tmp_path / "state", clock=clock, engine=engine,
                      max_backlog_rows=3) as server:
        assert post(server, json.dumps([watch(f"op{i}") for i in range(4)])).status_code == 200
        busy = post(server, json.dumps(watch("late")))
        assert busy.status_code == 503 and busy.headers["Retry-After"] == "1"
        engine.rows_read = 4  # the engine catches up
        assert post(server, json.dumps(watch("late"))).status_code == 200
        assert server.stats().refused_busy == 1


def test_a_nearly_full_disk_gets_503_and_nothing_is_written(tmp_path: Path,
                                                            clock: ManualClock) -> None:
    with SubmitServer(tmp_path / "in", tmp_path / "state", clock=clock,
                      free_bytes=lambda path: 1_000) as server:
        answer = post(server, json.dumps(watch("a")))
        assert answer.status_code == 503 and "free" in answer.json()["error"]
        assert landed_rows(server.input_dir) == []


class _FullDisk(SubmitJournal):
    def land(self, batch: object) -> object:  # type: ignore[override]
        raise OSError(errno.ENOSPC, "No space left on device")


def test_a_full_disk_while_writing_gets_503_and_the_key_stays_free(
        tmp_path: Path, clock: ManualClock) -> None:
    with SubmitServer(tmp_path / "in", tmp_path / "state", clock=clock) as server:
        working = server.journal
        server.journal = _FullDisk(tmp_path / "in", tmp_path / "state2", clock=clock)
        answer = post(server, json.dumps(watch("a")), **{"Idempotency-Key": "k-1"})
        assert answer.status_code == 503 and "full" in answer.json()["error"]
        clock.now += 1_000
        assert server.feed.time_floor() == 1_001_000  # its stamp let go: time need not wait
        server.journal = working
        answer = post(server, json.dumps(watch("a")), **{"Idempotency-Key": "k-1"})
        assert answer.status_code == 200 and "Idempotent-Replayed" not in answer.headers
        assert len(landed_rows(server.input_dir)) == 1


def test_a_journal_write_that_fails_takes_its_keys_back(tmp_path: Path,
                                                        clock: ManualClock) -> None:
    journal = SubmitJournal(tmp_path / "in", tmp_path / "state", clock=clock)
    # A directory where the commit's file goes: the rename into place fails.
    (tmp_path / "in" / "submit-0000001000000-000000.jsonl").mkdir()
    with pytest.raises(OSError):
        journal.land([Submission(['{"ts_ms":1,"type":"tick"}'], "k-1", "d1", 1)])
    journal.close()
    assert [path.read_bytes() for path in key_segments(tmp_path / "state")] == [b""]
    assert SubmitJournal(tmp_path / "in", tmp_path / "state", clock=clock).replay("k-1") is None


# -- status and address ----------------------------------------------------------


def test_status_has_the_engine_and_intake_counters(tmp_path: Path,
                                                   clock: ManualClock) -> None:
    with SubmitServer(tmp_path / "in", tmp_path / "state", clock=clock,
                      engine=FakeEngine(tmp_path / "in", pending=7)) as server:
        post(server, json.dumps(watch("a")))
        status = httpx.get(f"{server.url}/v1/status").json()
        assert status["engine"]["pending"] == 7 and status["engine"]["lag_ms"] is None
        assert status["intake"]["accepted_rows"] == 1 and status["intake"]["commits"] == 1
        assert httpx.get(f"{server.url}/metrics").status_code == 404  # none given


def test_the_server_binds_to_loopback_by_default(server: SubmitServer) -> None:
    assert server.host == "127.0.0.1" and server.port > 0


def test_a_port_in_use_is_refused_at_start(server: SubmitServer, tmp_path: Path) -> None:
    with pytest.raises(OSError):
        SubmitServer(tmp_path / "in2", tmp_path / "state2", port=server.port).start()


@pytest.mark.parametrize(("value", "address"), [
    ("8080", ("127.0.0.1", 8080)), ("0.0.0.0:1", ("0.0.0.0", 1)),
    ("[::1]:9", ("::1", 9)), (":7", ("127.0.0.1", 7))])
def test_listen_addresses(value: str, address: tuple[str, int]) -> None:
    assert parse_listen(value) == address


@pytest.mark.parametrize("value", ["", "host:", "host:port", "1:70000", "-1"])
def test_bad_listen_addresses_are_refused(value: str) -> None:
    with pytest.raises(ValueError, match="HOST:PORT"):
        parse_listen(value)
