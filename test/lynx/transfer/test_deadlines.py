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


def test_finish_puts_the_deadline_at_the_fifo_finish_plus_half_the_window():
    deadlines = ResidualDeadlines(window_s=2.0, fifo_bytes_per_s=10.0)
    # 10 bytes/s: room 1's 20 anchor + 40 residual bytes queued at t=0 finish at 6 s under FIFO
    deadlines.queued(0, 1, 20, now=0.0)
    deadlines.queued(1, 1, 40, now=0.0)
    # room 2 queued at t=1 behind room 1's bytes: FIFO ends it at 6 + 3 = 9 s
    deadlines.queued(0, 2, 10, now=1.0)
    deadlines.queued(1, 2, 20, now=1.0)
    deadlines.left(0, 1, 20, now=2.0)
    deadlines.left(0, 2, 10, now=3.0)
    assert deadlines.backlogs() == [Backlog(1, 40, 6.0 + 1.0), Backlog(2, 20, 9.0 + 1.0)]
    deadlines.set_window(2, 4.0)
    assert deadlines.backlogs()[1] == Backlog(2, 20, 9.0 + 2.0)


def test_finish_restarts_its_clock_after_an_idle_link_and_without_a_rate_falls_back_to_the_anchor():
    deadlines = ResidualDeadlines(window_s=2.0, fifo_bytes_per_s=10.0)
    deadlines.queued(0, 1, 10, now=0.0)
    deadlines.queued(1, 1, 10, now=0.0)  # FIFO finish at 2 s
    deadlines.queued(0, 2, 10, now=50.0)
    deadlines.queued(1, 2, 10, now=50.0)  # the link was idle: 52 s, not 4 s
    deadlines.left(0, 1, 10, now=1.0)
    deadlines.left(0, 2, 10, now=51.0)
    assert [b.deadline for b in deadlines.backlogs()] == [3.0, 53.0]
    unpaced = ResidualDeadlines(window_s=2.0, fifo_bytes_per_s=None)
    unpaced.queued(0, 1, 10, now=0.0)
    unpaced.queued(1, 1, 10, now=0.0)
    unpaced.left(0, 1, 10, now=1.5)
    assert unpaced.backlogs() == [Backlog(1, 10, 3.5)], "no rate: one window after the anchor left"


def test_finish_takes_a_dropped_chunks_bytes_out_of_the_fifo_finish_of_the_requests_behind_it():
    deadlines = ResidualDeadlines(window_s=0.0, fifo_bytes_per_s=10.0)
    for room in (1, 2):  # 10 bytes/s: room 1 finishes at 2 s, room 2 at 4 s
        deadlines.queued(0, room, 10, now=0.0)
        deadlines.queued(1, room, 10, now=0.0)
    deadlines.left(0, 1, 10, now=1.0)
    deadlines.left(0, 2, 10, now=1.0)
    deadlines.left(1, 1, 10, now=None)  # room 1's residual dropped (its request aborted)
    assert deadlines.backlogs() == [Backlog(2, 10, 3.0)], "room 2 no longer waits behind room 1's residual"
    deadlines.queued(0, 3, 10, now=0.0)
    assert deadlines._rooms[3].fifo_finish == 4.0
