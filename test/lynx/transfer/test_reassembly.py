"""Per-request reassembly: exact bytes out of any arrival order, rejections write nothing."""

import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lynx.transfer.frames import AUX_STREAM, DuplicateFrame, FrameError, FrameHeader, MalformedFrame, OversizedFrame
from lynx.transfer.policy import chunk_spans
from lynx.transfer.reassembly import RequestAssembly

ROOM = 42


def frames_of(stream, data, chunk_bytes, room=ROOM):
    spans = chunk_spans(len(data), chunk_bytes)
    return [
        (FrameHeader(room, stream, index, len(spans), offset, length, 0, 0), data[offset : offset + length])
        for index, (offset, length) in enumerate(spans)
    ]


class FakeClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        self.now += 1.0
        return self.now


@settings(max_examples=100, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 3000), min_size=1, max_size=3),
    chunk_bytes=st.integers(1, 700),
    seed=st.integers(0, 2**32 - 1),
)
def test_chunks_in_any_order_rebuild_every_stream_exactly(sizes, chunk_bytes, seed):
    rng = random.Random(seed)
    streams = {stream: rng.randbytes(size) for stream, size in enumerate(sizes)}
    assembly = RequestAssembly(ROOM, {stream: len(data) for stream, data in streams.items()})
    frames = [frame for stream, data in streams.items() for frame in frames_of(stream, data, chunk_bytes)]
    rng.shuffle(frames)
    completed = []
    for header, payload in frames:
        completed.extend(assembly.accept(header, payload))
    assert sorted(completed) == sorted(streams)
    for stream, data in streams.items():
        assert assembly.is_complete(stream)
        assert assembly.buffer(stream).tobytes() == data
    assert assembly.ready(streams)


def test_milestones_fire_exactly_once_with_timestamps():
    clock = FakeClock()
    anchor, residual, aux = b"A" * 10, b"R" * 25, b"meta"
    assembly = RequestAssembly(ROOM, {0: len(anchor), 1: len(residual), AUX_STREAM: len(aux)}, clock=clock)
    anchor_ready = (0, AUX_STREAM)
    events = []
    for header, payload in frames_of(AUX_STREAM, aux, 8) + frames_of(0, anchor, 4) + frames_of(1, residual, 4):
        for stream in assembly.accept(header, payload):
            events.append(stream)
        if assembly.ready(anchor_ready) and "anchor" not in events:
            events.append("anchor")
    assert events == [AUX_STREAM, 0, "anchor", 1]
    assert assembly.first_frame_at == 101.0
    assert set(assembly.completed_at) == {0, 1, AUX_STREAM}
    assert assembly.completed_at[AUX_STREAM] < assembly.completed_at[0] < assembly.completed_at[1]


def test_empty_stream_completes_with_its_single_empty_chunk():
    assembly = RequestAssembly(ROOM, {0: 4, 1: 0})
    assert not assembly.is_complete(1)
    assert assembly.accept(FrameHeader(ROOM, 1, 0, 1, 0, 0, 0, 0), b"") == frozenset({1})
    assert assembly.buffer(1).size == 0
    assert not assembly.ready((0, 1))


def test_accepts_memoryview_and_numpy_payloads():
    assembly = RequestAssembly(ROOM, {0: 8})
    assembly.accept(FrameHeader(ROOM, 0, 0, 2, 0, 4, 0, 0), memoryview(b"abcd"))
    assembly.accept(FrameHeader(ROOM, 0, 1, 2, 4, 4, 0, 0), np.frombuffer(b"efgh", dtype=np.uint8))
    assert assembly.buffer(0).tobytes() == b"abcdefgh"


def started_assembly():
    """A 12-byte stream 0 with chunk 0 (bytes 0..3 = b'good') already in."""
    assembly = RequestAssembly(ROOM, {0: 12, 1: 4})
    assembly.accept(FrameHeader(ROOM, 0, 0, 3, 0, 4, 0, 0), b"good")
    return assembly


def raw_bytes(assembly, stream):
    return assembly._streams[stream].buffer.tobytes()


@pytest.mark.parametrize(
    ("header", "payload", "error", "message"),
    [
        (FrameHeader(ROOM, 0, 0, 3, 0, 4, 0, 0), b"evil", DuplicateFrame, "duplicate"),
        (FrameHeader(ROOM, 0, 1, 3, 10, 4, 0, 0), b"evil", OversizedFrame, "outside"),
        (FrameHeader(ROOM, 0, 1, 3, 2**40, 4, 0, 0), b"evil", OversizedFrame, "outside"),
        (FrameHeader(ROOM, 0, 1, 4, 4, 4, 0, 0), b"evil", MalformedFrame, "num_chunks 4 disagrees"),
        (FrameHeader(ROOM, 0, 1, 3, 2, 4, 0, 0), b"evil", MalformedFrame, "overlap"),
        (FrameHeader(ROOM, 0, 1, 3, 4, 4, 0, 0), b"evil!", OversizedFrame, "payload has 5"),
        (FrameHeader(ROOM, 2, 0, 1, 0, 4, 0, 0), b"evil", MalformedFrame, "no stream 2"),
        (FrameHeader(ROOM, AUX_STREAM, 0, 1, 0, 4, 0, 0), b"evil", MalformedFrame, "no stream 255"),
        (FrameHeader(ROOM + 1, 0, 1, 3, 4, 4, 0, 0), b"evil", MalformedFrame, "room 43"),
        (FrameHeader(ROOM, 1, 0, 2, 0, 4, 0, 0), b"evil", MalformedFrame, "full before all 2"),
        (FrameHeader(ROOM, 1, 0, 1, 0, 2, 0, 0), b"ev", MalformedFrame, "2 of 4"),
    ],
    ids=[
        "duplicate", "past-end", "far-past-end", "num-chunks-changed", "overlap", "payload-length",
        "unknown-stream", "unexpected-aux", "other-room", "filled-too-early", "last-chunk-short",
    ],
)
def test_bad_frames_are_rejected_and_nothing_is_written(header, payload, error, message):
    assembly = started_assembly()
    before = {stream: raw_bytes(assembly, stream) for stream in (0, 1)}
    with pytest.raises(error, match=message):
        assembly.accept(header, payload)
    assert {stream: raw_bytes(assembly, stream) for stream in (0, 1)} == before
    assert not assembly.is_complete(0) and not assembly.is_complete(1)
    assembly.accept(FrameHeader(ROOM, 0, 1, 3, 4, 4, 0, 0), b"more")
    assert assembly.accept(FrameHeader(ROOM, 0, 2, 3, 8, 4, 0, 0), b"data") == frozenset({0})
    assert assembly.buffer(0).tobytes() == b"goodmoredata"


def test_frames_after_completion_are_duplicates_and_completion_is_not_reported_again():
    assembly = RequestAssembly(ROOM, {0: 4})
    header = FrameHeader(ROOM, 0, 0, 1, 0, 4, 0, 0)
    assert assembly.accept(header, b"done") == frozenset({0})
    with pytest.raises(DuplicateFrame):
        assembly.accept(header, b"done")
    assert assembly.buffer(0).tobytes() == b"done"


def test_buffer_of_incomplete_or_unknown_stream_is_refused():
    assembly = started_assembly()
    with pytest.raises(ValueError, match="not complete"):
        assembly.buffer(0)
    with pytest.raises(ValueError, match="no stream 7"):
        assembly.is_complete(7)


def test_frame_errors_do_not_escape_as_other_exceptions():
    assembly = started_assembly()
    for header in (FrameHeader(ROOM, 0, 0, 3, 0, 4, 0, 0), FrameHeader(ROOM, 9, 0, 1, 0, 4, 0, 0)):
        with pytest.raises(FrameError):
            assembly.accept(header, b"evil")


@pytest.mark.parametrize("sizes", [{}, {16: 4}, {0: -1}, {0: 1.5}])
def test_invalid_stream_sizes_are_value_errors(sizes):
    with pytest.raises(ValueError):
        RequestAssembly(ROOM, sizes)
