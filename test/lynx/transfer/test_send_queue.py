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
    queues.record_sent(chunk)
    queues.release("a", chunk.nbytes)
    stats = queues.stats()
    assert dict(stats.sent_bytes_by_class) == {1: 5} and stats.chunks_sent == 1 and stats.queued_bytes == 0
