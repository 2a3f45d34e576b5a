"""The sender's queues without a thread: which chunk goes next, what a drop releases, the counters."""

from lynx.transfer.send_queue import SendQueues, Submission


def queue_stream(queues, endpoint, room, stream, sizes):
    submission = Submission(endpoint, room, stream, len(sizes))
    queues.add(stream, submission, [([b"x" * n], n) for n in sizes])
    return submission


def always(endpoint):
    return True


def test_the_lowest_class_goes_first_and_fifo_holds_within_a_class():
    queues = SendQueues()
    queue_stream(queues, "a", 1, 1, [3])
    queue_stream(queues, "a", 2, 0, [1, 2])
    order = [(chunk.submission.room, chunk.nbytes) for chunk in iter(lambda: queues.pop_next(always), None)]
    assert order == [(2, 1), (2, 2), (1, 3)]
    assert queues.queued_bytes("a") == 6, "popped chunks count until released"


def test_an_endpoint_that_is_not_ready_is_passed_over():
    queues = SendQueues()
    queue_stream(queues, "slow", 1, 0, [4])
    queue_stream(queues, "fast", 2, 1, [4])
    assert queues.pop_next(lambda endpoint: endpoint == "fast").submission.room == 2
    assert queues.pop_next(lambda endpoint: endpoint == "fast") is None and queues.has_chunks()


def test_a_drop_marks_the_streams_dropped_and_releases_their_bytes():
    queues = SendQueues()
    doomed = queue_stream(queues, "a", 1, 0, [4, 4])
    kept = queue_stream(queues, "a", 2, 0, [2])
    assert len(queues.drop(lambda chunk: chunk.submission.room == 1)) == 2
    assert doomed.dropped and not kept.dropped
    assert queues.queued_bytes("a") == 2 and queues.stats().chunks_dropped == 2
    queues.clear()
    assert queues.idle() and not queues.has_chunks()


def test_sent_bytes_are_counted_per_class():
    queues = SendQueues()
    queue_stream(queues, "a", 1, 1, [5])
    chunk = queues.pop_next(always)
    queues.record_sent(chunk, now=1.0)
    queues.release("a", chunk.nbytes)
    stats = queues.stats()
    assert dict(stats.sent_bytes_by_class) == {1: 5} and stats.chunks_sent == 1 and stats.queued_bytes == 0


def _drain(queues, now, rate):
    order = []
    while (chunk := queues.pop_next(always, now, rate)) is not None:
        queues.record_sent(chunk, now)
        order.append((chunk.submission.room, chunk.pending.priority))
        now += chunk.nbytes / rate
    return order


def test_without_deadlines_every_anchor_overtakes_every_residual():
    queues = SendQueues()
    queue_stream(queues, "a", 1, 0, [10])
    queues.record_sent(queues.pop_next(always), now=0.0)
    queue_stream(queues, "a", 1, 1, [10, 10])
    queue_stream(queues, "a", 2, 0, [10, 10, 10])
    assert _drain(queues, 1.0, 10.0) == [(2, 0)] * 3 + [(1, 1)] * 2


def test_a_residual_goes_before_newer_anchors_once_it_would_miss_its_deadline():
    from lynx.transfer.deadlines import ResidualDeadlines

    queues = SendQueues(ResidualDeadlines(window_s=3.5))
    queue_stream(queues, "a", 1, 0, [10])
    queues.record_sent(queues.pop_next(always), now=0.0)  # room 1's anchor left at 0: residual due by 3.5
    queue_stream(queues, "a", 1, 1, [10, 10])
    queue_stream(queues, "a", 2, 0, [10, 10, 10])
    # 10 bytes/s: one anchor chunk (1 s) still leaves room 1's two residual chunks done at 3 s <= 3.5;
    # a second would end them at 4 s, so they go first, then the rest of room 2's anchor.
    assert _drain(queues, 0.0, 10.0) == [(2, 0), (1, 1), (1, 1), (2, 0), (2, 0)]


def test_a_residual_is_not_due_while_its_own_anchor_waits():
    from lynx.transfer.deadlines import ResidualDeadlines

    queues = SendQueues(ResidualDeadlines(window_s=0.0))
    queue_stream(queues, "a", 2, 0, [10])
    queue_stream(queues, "a", 1, 0, [10])
    queue_stream(queues, "a", 1, 1, [10])
    queue_stream(queues, "a", 3, 0, [10])
    # room 1's residual waits while its anchor is queued, and is due the moment it has left
    assert _drain(queues, 0.0, 10.0) == [(2, 0), (1, 0), (1, 1), (3, 0)]


def test_on_an_unpaced_link_a_residual_is_due_once_its_deadline_has_passed():
    from lynx.transfer.deadlines import ResidualDeadlines

    queues = SendQueues(ResidualDeadlines(window_s=2.0))
    queue_stream(queues, "a", 1, 0, [10])
    queues.record_sent(queues.pop_next(always), now=0.0)
    queue_stream(queues, "a", 1, 1, [10])
    queue_stream(queues, "a", 2, 0, [10, 10])
    assert queues.pop_next(always, now=1.9, bytes_per_s=None).submission.room == 2
    assert queues.pop_next(always, now=2.0, bytes_per_s=None).submission.room == 1


def test_with_finish_deadlines_a_burst_of_anchors_overtakes_a_residual_its_fifo_finish_can_wait_for():
    from lynx.transfer.deadlines import ResidualDeadlines

    def burst(deadlines):
        queues = SendQueues(deadlines)
        queues.add(0, Submission("a", 1, 0, 1), [([b"x"], 10)], now=0.0)
        queues.record_sent(queues.pop_next(always), now=1.0)  # room 1's anchor left at 1 s
        queues.add(1, Submission("a", 1, 1, 2), [([b"x"], 10)] * 2, now=0.0)
        for room in (2, 3, 4):  # three newer anchors arrive at 1 s
            queues.add(0, Submission("a", room, 0, 1), [([b"x"], 10)], now=1.0)
        return [room for room, _ in _drain(queues, 1.0, 10.0)]

    # window 2 s: anchor-relative, room 1's residual (2 s of bytes) is due at 3 s, so it goes at once;
    # finish: FIFO would end room 1 at 3 s, due at 3 + 1 = 4 s, so one newer anchor goes first
    assert burst(ResidualDeadlines(window_s=2.0)) == [1, 1, 2, 3, 4]
    assert burst(ResidualDeadlines(window_s=2.0, fifo_bytes_per_s=10.0)) == [2, 1, 1, 3, 4]
