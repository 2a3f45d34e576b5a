"""Residual deadlines without queues: when a residual is due, and each request's bookkeeping."""

import pytest
from lynx.transfer.deadlines import Backlog, ResidualDeadlines, residual_due


def test_a_residual_is_due_when_an_anchor_chunk_first_would_make_any_queued_residual_late():
    backlogs = [Backlog(1, 10, deadline=5.0), Backlog(2, 10, deadline=2.5)]
    # 10 bytes/s from t=0: room 1 ends at 2 s (ok), room 2 at 3 s (> 2.5): due.
    assert residual_due(backlogs, 10, now=0.0, bytes_per_s=10.0)
    assert not residual_due(backlogs[:1], 10, now=0.0, bytes_per_s=10.0)


def test_a_residual_whose_anchor_has_not_left_is_never_due_but_its_bytes_still_count_ahead():
    backlogs = [Backlog(1, 30, deadline=None), Backlog(2, 10, deadline=4.5)]
    assert residual_due(backlogs, 10, now=0.0, bytes_per_s=10.0)  # 10 + 30 + 10 bytes: ends at 5 s
    assert not residual_due(backlogs[:1], 10**6, now=0.0, bytes_per_s=10.0)


def test_the_deadline_is_the_last_anchor_chunks_departure_plus_the_window():
    deadlines = ResidualDeadlines(window_s=1.0)
    deadlines.queued(0, 7, 4)
    deadlines.queued(0, 7, 4)
    deadlines.queued(1, 7, 8)
    deadlines.left(0, 7, 4, now=2.0)
    assert deadlines.backlogs() == [Backlog(7, 8, None)], "one anchor chunk still queued"
    deadlines.left(0, 7, 4, now=3.0)
    assert deadlines.backlogs() == [Backlog(7, 8, 4.0)]
    deadlines.set_window(7, 0.25)
    assert deadlines.backlogs() == [Backlog(7, 8, 3.25)]
    deadlines.left(1, 7, 8, now=3.5)
    assert deadlines.backlogs() == []
    deadlines.queued(1, 7, 2)
    assert deadlines.backlogs() == [Backlog(7, 2, 3.25)], "a residual queued after its anchor left keeps the deadline"


def test_only_so_many_requests_with_nothing_queued_are_remembered():
    from lynx.transfer import deadlines as module

    deadlines = ResidualDeadlines(window_s=1.0)
    for room in range(module.REMEMBERED_ROOMS + 10):
        deadlines.queued(0, room, 1)
        deadlines.left(0, room, 1, now=float(room))
    assert len(deadlines._rooms) == module.REMEMBERED_ROOMS


def test_a_dropped_anchor_does_not_arm_a_deadline_and_no_window_means_strict_priority():
    deadlines = ResidualDeadlines(window_s=None)
    deadlines.queued(0, 1, 4)
    deadlines.queued(1, 1, 4)
    deadlines.left(0, 1, 4, now=None)
    assert deadlines.backlogs() == [Backlog(1, 4, None)]
    assert not deadlines.due(10**9, now=10**9, bytes_per_s=1.0)


def test_windows_must_not_be_negative():
    with pytest.raises(ValueError):
        ResidualDeadlines(window_s=-1.0)
    with pytest.raises(ValueError):
        ResidualDeadlines(window_s=1.0).set_window(3, -0.5)
