"""Event logs for the pipeline's tests."""

from __future__ import annotations

import json
import random
from typing import Any

#: The lateness bound the logs keep within: their rows are disordered by less.
LATENESS_MS = 1_000


def random_log(seed: int, rows: int = 1_500, gaps: bool = True) -> list[str]:
    """Few keys and timestamps, so there are ties; updates before watches; cancels of
    completed, expired and unknown operations; errors; multi-key operations of every
    keyed condition; duplicate op ids, and copies of a watch in another text; targets
    and payloads on some watches and schedules; malformed rows; disorder within the
    bound; with ``gaps``, a few stretches of 1.5 to 15 s without a row, in which
    schedules' occurrences are noticed late."""
    rng = random.Random(seed)
    copies = random.Random(seed + 31)  # apart, so that the rest of the log is unchanged
    carrier = random.Random(seed + 97)
    spacer = random.Random(seed + 61)
    keys = [f"k{i}" for i in range(6)]
    lines: list[tuple[int, str]] = []
    op_ids: list[str] = []
    ts = 10_000
    for _ in range(rows):
        ts += rng.choice((0, 0, 1, 3, 10))
        if gaps and spacer.random() < 0.006:
            ts += spacer.choice((1_500, 4_000, 15_000))
        roll = rng.random()
        row: dict[str, Any]
        if roll < 0.35:
            op_id = f"op-{len(op_ids)}" if rng.random() > 0.03 or not op_ids else \
                rng.choice(op_ids)
            op_ids.append(op_id)
            condition = rng.choice(("all_at_least", "sum_at_least", "any_update", "none"))
            watched = [] if condition == "none" else rng.sample(keys, rng.randint(1, 3))
            row = {"ts_ms": ts, "type": "watch", "op_id": op_id, "keys": watched,
                   "deadline_ms": ts + rng.choice((-5, 0, 20, 100, 400, 5_000)),
                   "condition": condition}
            if condition == "all_at_least":
                row["targets"] = {k: rng.randint(0, 60) for k in watched}
            elif condition == "sum_at_least":
                row["targets"] = {k: rng.randint(0, 40) for k in watched}
                row["min_total"] = rng.randint(1, 30)
            _carry(carrier, row)
        elif roll < 0.75:
            row = {"ts_ms": ts, "type": "update", "key": rng.choice(keys),
                   "value": rng.randint(0, 80)}
        elif roll < 0.8:
            row = {"ts_ms": ts, "type": "update", "key": rng.choice(keys),
                   "error": rng.choice(("NOT_LEADER", "UNKNOWN_PARTITION"))}
        elif roll < 0.9:
            row = {"ts_ms": ts, "type": "cancel",
                   "op_id": rng.choice(op_ids) if op_ids and rng.random() < 0.9 else "nope"}
        elif roll < 0.95:
            row = {"ts_ms": ts, "type": "tick"}
        else:
            bad = rng.choice(('{"ts_ms": 1, "type": "update", "key": "k0", "value": 1.5}',
                              'not json', '[1, 2]', '{"ts_ms": "12", "type": "tick"}',
                              '{"type": "watch"}', '{"ts_ms": 5, "type": "launch"}',
                              '{"ts_ms":1,"type":"cancel","op_id":"op-0","op_id":"a:b"}'))
            lines.append((ts, bad))
            continue
        # Most rows in the compact form, which travels without its text (see
        # compact_wire), and the rest as json.dumps writes them, which keeps it.
        compact = len(lines) % 4 != 0
        texts = (json.dumps(row, separators=(",", ":")), json.dumps(row))
        lines.append((ts, texts[0] if compact else texts[1]))
        if row["type"] == "watch" and copies.random() < 0.03:  # sent twice: one watch
            lines.append((ts, texts[1] if compact else texts[0]))
    lines += schedule_rows(random.Random(seed + 7_919), 10_000, ts)
    # Disorder within the bound: each row moves back by less than the lateness.
    jittered = sorted(lines, key=lambda item: item[0] - rng.randrange(LATENESS_MS // 2))
    return [line for _, line in jittered]


def _carry(rng: random.Random, row: dict[str, Any]) -> None:
    """A target on some rows, a payload (of any JSON type) on some."""
    if rng.random() < 0.3:
        row["target"] = rng.choice(("coupons", "orders"))
    if rng.random() < 0.3:
        row["payload"] = rng.choice(({"n": rng.randint(0, 9)}, [1, "ü"], "text", 7, None))


_SPECS: list[dict[str, Any]] = [
    {"every_ms": 50, "grace_ms": 1_200},
    {"every_ms": 170, "anchor_ms": 3, "jitter_ms": 60},
    {"every_ms": 400, "max_runs": 4},
    {"every_ms": 90, "start_ms": 11_000, "end_ms": 12_500, "misfire": "all",
     "grace_ms": 1_000, "catchup_ms": 1_500},
    {"cron": "* * * * * *", "tz": "America/New_York", "jitter_ms": 700},
    {"cron": "*/2 * * * * *", "tz": "Australia/Lord_Howe", "misfire": "skip",
     "grace_ms": 1_000},
]


def schedule_rows(rng: random.Random, start: int, end: int) -> list[tuple[int, str]]:
    """Recurring schedules over [start, end]: specs replaced, paused and resumed
    (in every misfire policy), unscheduled, rows for unknown ids, ties at one
    ``ts_ms``, and malformed schedule rows. Each grace is longer than the tests'
    steps of a wall clock, so a follow engine on one notices every occurrence on
    time, as event time does; pauses outlast some of them."""
    rows: list[tuple[int, dict[str, Any] | str]] = []
    for n in range(rng.randint(3, 6)):
        sid = f"sched-{n}"
        at = rng.randint(start, start + (end - start) // 3)
        rows.append((at, {"type": "schedule", "schedule_id": sid, **rng.choice(_SPECS)}))
        if rng.random() < 0.8:
            paused = rng.randint(at, end)
            rows.append((paused, {"type": "pause", "schedule_id": sid}))
            rows.append((paused + rng.randint(50, 3_000),
                         {"type": "resume", "schedule_id": sid}))
        for _ in range(rng.randint(0, 3)):
            at = rng.randint(at, end)
            kind = rng.choice(("pause", "resume", "resume", "schedule", "unschedule"))
            row: dict[str, Any] = {"type": kind, "schedule_id": sid}
            if kind == "schedule":
                row.update(rng.choice(_SPECS))
            rows.append((at, row))
    at = rng.randint(start, end)
    rows.append((at, {"type": "pause", "schedule_id": "nobody"}))
    rows.append((at, {"type": "schedule", "schedule_id": "tie", "every_ms": 70}))
    rows.append((at, {"type": "schedule", "schedule_id": "tie", "every_ms": 30}))
    rows.append((at, {"type": "pause", "schedule_id": "tie"}))
    rows.append((at + rng.randint(0, 900), {"type": "resume", "schedule_id": "tie"}))
    rows.append((rng.randint(start, end), '{"ts_ms":10001,"type":"schedule",'
                                          '"schedule_id":"never","cron":"0 0 30 2 *"}'))
    rows.append((rng.randint(start, end), '{"ts_ms":10002,"type":"schedule",'
                                          '"schedule_id":"zone","cron":"* * * * *",'
                                          '"tz":"Mars/Olympus"}'))
    out: list[tuple[int, str]] = []
    carrier = random.Random(start * 31 + end)
    for at, row in rows:
        if isinstance(row, str):
            out.append((at, row))
        else:
            if row["type"] == "schedule":
                _carry(carrier, row)
            out.append((at, json.dumps({"ts_ms": at, **row}, separators=(",", ":"))))
    return out
