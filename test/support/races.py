"""A check shared by the room-table tests: a close that lands while an anchor is being reported waits for it."""

from __future__ import annotations

import threading


def assert_close_waits_for_the_report(if_anchored, key, close) -> None:
    """Report `key` anchored through `if_anchored(key, report)` with a report that blocks, call `close()`
    meanwhile, and check that `close` returns only after the report, which happens once and never again."""
    reported = []
    inside, go = threading.Event(), threading.Event()

    def slow_report(value):
        inside.set()
        go.wait(10)
        reported.append(value)

    reporter = threading.Thread(target=if_anchored, args=(key, slow_report))
    reporter.start()
    assert inside.wait(10)
    closer = threading.Thread(target=close)
    closer.start()
    closer.join(0.2)
    assert closer.is_alive(), "close returned while the anchor was being reported"
    go.set()
    reporter.join(10)
    closer.join(10)
    assert reported == [key]
    assert not if_anchored(key, reported.append) and reported == [key]  # closed: never reported again
