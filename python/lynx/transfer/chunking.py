"""Cutting one stream into signed frames: chunk spans, the layer range of each, the frame MAC."""

from __future__ import annotations

from collections.abc import Sequence

from lynx.transfer.frames import FrameHeader, encode_frame
from lynx.transfer.policy import check_layer_bounds, chunk_spans, layers_of_span

MAX_LAYERS = (1 << 16) - 1
MAX_FRAME_PAYLOAD = (1 << 32) - 1  # the frame header's u32 length field


def sign_chunks(
    room: int,
    stream: int,
    view: memoryview,
    chunk_bytes: int,
    key: bytes,
    layer_bounds: Sequence[int] | None = None,
    segment: int = 0,
    frames: range | None = None,
) -> list[tuple[list, int]]:
    """The frames of one stream in order, as ``(parts, payload_bytes)`` per chunk.

    Args:
        view: the stream's bytes, flat; the payloads are slices of it (not copied).
        chunk_bytes: payload bytes per frame (the last may be shorter; an empty
            stream gives one empty frame).
        key: the frames' MAC key.
        layer_bounds: cumulative byte bounds of the model layers within the
            stream, ``[0, b1, ..., len(view)]``; each frame then carries the
            layer range it overlaps (``(0, 0)`` without).
        segment: the segment of the request's tokens the stream belongs to.
        frames: only these chunk indices (default: all); a stream whose bytes
            are produced in order goes out in pieces this way, each frame
            exactly as it would be in one piece (see `frames_ready`).

    Raises:
        ValueError: bad layer bounds, more layers than a frame header holds,
            or `frames` outside the stream's chunks.
    """
    total = len(view)
    if layer_bounds is not None:
        check_layer_bounds(layer_bounds, total)
        if len(layer_bounds) - 1 > MAX_LAYERS:
            raise ValueError(f"at most {MAX_LAYERS} layers fit in a frame header")
    spans = chunk_spans(total, chunk_bytes)
    indices = range(len(spans)) if frames is None else frames
    if indices.step != 1 or (len(indices) and not 0 <= indices.start < indices.stop <= len(spans)):
        raise ValueError(f"frames {indices!r} are not a run of the stream's {len(spans)} chunks")
    signed = []
    for index in indices:
        offset, length = spans[index]
        layers = layers_of_span(offset, length, layer_bounds) if layer_bounds is not None else (0, 0)
        header = FrameHeader(room, stream, index, len(spans), offset, length, *layers, segment=segment)
        signed.append((encode_frame(header, view[offset : offset + length], key), length))
    return signed


def frames_ready(total: int, chunk_bytes: int, ready_bytes: int) -> int:
    """How many leading chunks of a ``total``-byte stream lie wholly in its first ``ready_bytes`` bytes
    (all of them, the empty stream's one included, once ``ready_bytes >= total``)."""
    if ready_bytes >= total:
        return len(chunk_spans(total, chunk_bytes))
    return max(0, ready_bytes) // chunk_bytes
