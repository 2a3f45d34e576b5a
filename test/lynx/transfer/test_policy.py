"""The pure priority policy and chunking: ordering properties without sockets."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lynx.transfer.policy import Pending, chunk_spans, layers_of_span, next_index


def drain(pending):
    """Pop entries in policy order until none is left."""
    left = list(pending)
    order = []
    while (index := next_index(left)) is not None:
        order.append(left.pop(index))
    return order


def test_empty_queue_has_nothing_to_send():
    assert next_index([]) is None


def test_new_request_anchor_overtakes_queued_residuals_of_older_requests():
    residuals_of_old_requests = [Pending(priority=1, seq=seq) for seq in range(10)]
    new_anchor = Pending(priority=0, seq=10)
    queue = residuals_of_old_requests + [new_anchor]
    assert queue[next_index(queue)] == new_anchor


def test_fifo_within_a_class():
    queue = [Pending(1, 5), Pending(1, 2), Pending(1, 9), Pending(1, 3)]
    assert [entry.seq for entry in drain(queue)] == [2, 3, 5, 9]


def test_every_anchor_goes_before_any_residual_and_stage_order_is_kept():
    queue = [Pending(2, 0), Pending(1, 1), Pending(0, 2), Pending(2, 3), Pending(0, 4), Pending(1, 5)]
    assert [(entry.priority, entry.seq) for entry in drain(queue)] == [(0, 2), (0, 4), (1, 1), (1, 5), (2, 0), (2, 3)]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 4), st.booleans()), max_size=60))
def test_online_popping_is_strict_priority_and_fifo(events):
    """Interleave arrivals and pops: each pop is the best entry present at that moment."""
    present, seq = [], 0
    for priority, pop in events:
        if pop:
            index = next_index(present)
            if index is None:
                continue
            chosen = present.pop(index)
            assert all(chosen.priority <= other.priority for other in present)
            assert all(chosen.seq < other.seq for other in present if other.priority == chosen.priority)
        else:
            present.append(Pending(priority, seq))
            seq += 1


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 15), max_size=80), st.randoms())
def test_draining_a_snapshot_sorts_by_priority_then_arrival(priorities, rng):
    queue = [Pending(priority, seq) for seq, priority in enumerate(priorities)]
    rng.shuffle(queue)
    assert drain(queue) == sorted(queue, key=lambda entry: (entry.priority, entry.seq))


def test_pending_rejects_negative_fields():
    with pytest.raises(ValueError):
        Pending(-1, 0)
    with pytest.raises(ValueError):
        Pending(0, -1)


@settings(max_examples=200, deadline=None)
@given(total=st.integers(0, 10_000), chunk_bytes=st.integers(1, 3000))
def test_chunk_spans_cover_the_stream_exactly_in_bounded_chunks(total, chunk_bytes):
    spans = chunk_spans(total, chunk_bytes)
    assert spans[0][0] == 0
    assert sum(length for _, length in spans) == total
    for (offset, length), (next_offset, _) in zip(spans, spans[1:]):
        assert next_offset == offset + length
        assert length == chunk_bytes
    assert all(0 < length <= chunk_bytes for _, length in spans) or spans == [(0, 0)]


def test_empty_stream_still_has_one_chunk():
    assert chunk_spans(0, 1 << 20) == [(0, 0)]


def test_chunk_spans_examples_and_errors():
    assert chunk_spans(10, 4) == [(0, 4), (4, 4), (8, 2)]
    assert chunk_spans(8, 4) == [(0, 4), (4, 4)]
    with pytest.raises(ValueError):
        chunk_spans(10, 0)
    with pytest.raises(ValueError):
        chunk_spans(-1, 4)


def test_layers_of_span_examples():
    bounds = [0, 10, 10, 25, 40]  # layer 1 is empty
    assert layers_of_span(0, 10, bounds) == (0, 1)
    assert layers_of_span(0, 11, bounds) == (0, 3)
    assert layers_of_span(10, 5, bounds) == (2, 3)
    assert layers_of_span(9, 2, bounds) == (0, 3)
    assert layers_of_span(24, 2, bounds) == (2, 4)
    assert layers_of_span(0, 40, bounds) == (0, 4)
    assert layers_of_span(40, 0, bounds) == (4, 4)
    assert layers_of_span(0, 0, [0, 0, 0]) == (0, 0)
    with pytest.raises(ValueError):
        layers_of_span(35, 6, bounds)


@settings(max_examples=200, deadline=None)
@given(sizes=st.lists(st.integers(0, 50), min_size=1, max_size=12), data=st.data())
def test_layers_of_span_is_exactly_the_overlapping_layers(sizes, data):
    bounds = [0]
    for size in sizes:
        bounds.append(bounds[-1] + size)
    total = bounds[-1]
    offset = data.draw(st.integers(0, total))
    length = data.draw(st.integers(1 if offset < total else 0, max(total - offset, 0)))
    start, end = layers_of_span(offset, length, bounds)
    span_end = offset + length
    overlapping = [layer for layer in range(len(sizes)) if bounds[layer] < span_end and offset < bounds[layer + 1]]
    if overlapping:
        assert (start, end) == (overlapping[0], overlapping[-1] + 1)
    else:
        assert start == end
