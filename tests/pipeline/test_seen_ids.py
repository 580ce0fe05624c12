"""The op ids a partition has seen, kept as a log of changes: replayed in order, and
rewritten whole once the log holds twice what it must keep."""

from __future__ import annotations

from tickwheel.pipeline.seen_ids import SeenIds


def test_changes_apply_in_log_order_and_an_id_seen_again_moves_to_the_end() -> None:
    seen = SeenIds()
    seen.apply([("a", 1), ("b", 2), ("a", None), ("c", 3), ("a", 9)])
    assert list(seen.ids.items()) == [("b", 2), ("c", 3), ("a", 9)]
    assert seen.entries == 5


def test_the_log_is_rewritten_only_once_it_holds_twice_what_it_keeps() -> None:
    seen = SeenIds()
    seen.apply((f"id-{i}", i) for i in range(70_000))
    assert not seen.needs_rewrite()  # every entry is live
    seen.apply((f"id-{i}", None) for i in range(70_000))
    seen.apply((f"new-{i}", i) for i in range(10))
    assert seen.needs_rewrite()  # 140,010 entries for 10 ids
    rewritten = seen.rewrite()
    assert rewritten == [(f"new-{i}", i) for i in range(10)]
    assert seen.entries == 10 and not seen.needs_rewrite()
    replayed = SeenIds()
    replayed.apply(rewritten)
    assert replayed.ids == seen.ids
