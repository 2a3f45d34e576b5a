"""Cutting a stream into signed frames: coverage, layer ranges, the header's limits."""

import pytest

from lynx.transfer.chunking import MAX_LAYERS, sign_chunks
from lynx.transfer.frames import FrameAuthError, decode_frame

KEY = b"secret"


def decoded(frames, key=KEY):
    return [decode_frame([bytes(part) for part in parts], key, max_payload=1 << 20) for parts, _ in frames]


def test_frames_cover_the_stream_in_order_and_carry_the_layers_they_overlap():
    data = memoryview(bytes(range(10)))
    frames = sign_chunks(7, 1, data, 4, KEY, layer_bounds=[0, 3, 3, 10], segment=2)
    assert [nbytes for _, nbytes in frames] == [4, 4, 2]
    headers = [header for header, _ in decoded(frames)]
    assert b"".join(bytes(payload) for _, payload in decoded(frames)) == bytes(data)
    assert [(h.room, h.stream, h.chunk_index, h.num_chunks, h.segment) for h in headers] == [
        (7, 1, i, 3, 2) for i in range(3)
    ]
    assert [(h.layer_start, h.layer_end) for h in headers] == [(0, 3), (2, 3), (2, 3)]


def test_an_empty_stream_is_one_empty_frame_without_layers():
    (header, payload), = decoded(sign_chunks(1, 0, memoryview(b""), 4, KEY))
    assert (header.num_chunks, header.length, header.layer_start, header.layer_end) == (1, 0, 0, 0)
    assert bytes(payload) == b""


def test_frames_are_signed_with_the_key_given():
    frames = sign_chunks(1, 0, memoryview(b"abcd"), 4, b"other")
    with pytest.raises(FrameAuthError):
        decoded(frames)


def test_more_layers_than_a_frame_header_holds_are_refused():
    bounds = list(range(MAX_LAYERS + 2))
    with pytest.raises(ValueError, match="layers fit in a frame header"):
        sign_chunks(1, 0, memoryview(bytes(MAX_LAYERS + 1)), 4, KEY, layer_bounds=bounds)


def test_a_stream_signed_in_runs_gives_exactly_the_frames_of_one_signing():
    from lynx.transfer.chunking import frames_ready

    data = memoryview(bytes(range(256)) * 3)
    whole = sign_chunks(5, 1, data, 100, KEY, layer_bounds=[0, 300, 768], segment=1)
    ready = [frames_ready(768, 100, upto) for upto in (0, 99, 100, 350, 767, 768)]
    assert ready == [0, 0, 1, 3, 7, 8]
    runs = [range(0, 3), range(3, 7), range(7, 8)]
    pieces = [frame for run in runs for frame in sign_chunks(5, 1, data, 100, KEY, [0, 300, 768], 1, frames=run)]
    assert [bytes(b"".join(parts)) for parts, _ in pieces] == [bytes(b"".join(parts)) for parts, _ in whole]
    assert frames_ready(0, 100, 0) == 1, "an empty stream's one frame is ready at once"
    with pytest.raises(ValueError, match="not a run"):
        sign_chunks(5, 1, data, 100, KEY, frames=range(6, 9))
