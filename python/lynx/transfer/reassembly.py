"""Per-request reassembly of received frames, with completion milestones.

A ``RequestAssembly`` owns one preallocated uint8 buffer per expected stream.
Frames are validated against what the request expects before a single byte
is written, so a bad frame never lands outside (or on top of) good data.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType

import numpy as np

from lynx.transfer.frames import DuplicateFrame, FrameHeader, MalformedFrame, OversizedFrame, check_stream


class _StreamState:
    """Reception state of one stream: the buffer and the chunks seen so far."""

    def __init__(self, size: int) -> None:
        self.buffer = np.empty(size, dtype=np.uint8)
        self.num_chunks: int | None = None
        self.chunks: set[int] = set()
        self.starts: list[int] = []
        self.ends: list[int] = []
        self.received = 0

    @property
    def complete(self) -> bool:
        return self.num_chunks is not None and len(self.chunks) == self.num_chunks


class RequestAssembly:
    """Reassembles the streams of one request (one room).

    Args:
        room: the request id frames must carry.
        stream_sizes: stream id -> expected total bytes (0 allowed), including
            ``AUX_STREAM`` if the request has one.
        clock: seconds, monotonic; stamps ``first_frame_at`` and ``completed_at``.

    A stream is complete when all its ``num_chunks`` distinct chunks arrived
    and, never overlapping, they cover its bytes exactly.
    """

    def __init__(self, room: int, stream_sizes: Mapping[int, int], clock: Callable[[], float] = time.monotonic) -> None:
        if not isinstance(room, int) or not 0 <= room < 1 << 64:
            raise ValueError(f"room must be a u64 int, got {room!r}")
        if not stream_sizes:
            raise ValueError("a request needs at least one stream")
        for stream, size in stream_sizes.items():
            check_stream(stream)
            if not isinstance(size, int) or isinstance(size, bool) or size < 0:
                raise ValueError(f"size of stream {stream} must be a non-negative int, got {size!r}")
        self.room = room
        self._clock = clock
        self._streams = {stream: _StreamState(size) for stream, size in stream_sizes.items()}
        self._completed_at: dict[int, float] = {}
        self.first_frame_at: float | None = None

    @property
    def streams(self) -> frozenset[int]:
        """The stream ids this request expects."""
        return frozenset(self._streams)

    @property
    def completed_at(self) -> Mapping[int, float]:
        """Stream id -> clock time its last chunk arrived, for complete streams."""
        return MappingProxyType(dict(self._completed_at))

    def accept(self, header: FrameHeader, payload) -> frozenset[int]:
        """Copy one frame's payload into place; return the streams it completed (usually empty).

        Raises (nothing written):
            MalformedFrame: other room, unknown stream, num_chunks disagreeing
                with earlier frames, overlap with bytes already received, a last
                chunk that leaves the stream uncovered, or an earlier one that
                fills it. (``chunk_index <
                num_chunks`` is enforced by ``FrameHeader`` itself.)
            OversizedFrame: payload size differs from header.length, or the
                span falls outside the stream.
            DuplicateFrame: this chunk index already arrived.
        """
        data = np.frombuffer(payload, dtype=np.uint8) if len(payload) else np.empty(0, dtype=np.uint8)
        state = self._check(header, data)
        start, end = header.offset, header.offset + header.length
        if self.first_frame_at is None:
            self.first_frame_at = self._clock()
        state.buffer[start:end] = data
        state.num_chunks = header.num_chunks
        state.chunks.add(header.chunk_index)
        if end > start:
            position = bisect_left(state.starts, start)
            state.starts.insert(position, start)
            state.ends.insert(position, end)
        state.received += header.length
        if not state.complete:
            return frozenset()
        self._completed_at[header.stream] = self._clock()
        return frozenset((header.stream,))

    def is_complete(self, stream: int) -> bool:
        """Whether every byte of ``stream`` has arrived."""
        return self._state(stream).complete

    def ready(self, streams: Iterable[int]) -> bool:
        """Whether all of ``streams`` are complete (e.g. ``(0, AUX_STREAM)`` for anchor-ready)."""
        return all(self.is_complete(stream) for stream in streams)

    def buffer(self, stream: int) -> np.ndarray:
        """The stream's bytes, a 1-D uint8 array of its expected size; only once complete."""
        state = self._state(stream)
        if not state.complete:
            raise ValueError(f"stream {stream} of room {self.room} is not complete yet")
        return state.buffer

    def _state(self, stream: int) -> _StreamState:
        state = self._streams.get(stream)
        if state is None:
            raise ValueError(f"room {self.room} has no stream {stream}; it expects {sorted(self._streams)}")
        return state

    def _check(self, header: FrameHeader, data: np.ndarray) -> _StreamState:
        where = f"room {header.room} stream {header.stream} chunk {header.chunk_index}"
        if header.room != self.room:
            raise MalformedFrame(f"{where}: frame for room {header.room} given to room {self.room}")
        state = self._streams.get(header.stream)
        if state is None:
            expected = sorted(self._streams)
            raise MalformedFrame(f"{where}: this request has no stream {header.stream} (expects {expected})")
        if len(data) != header.length:
            raise OversizedFrame(f"{where}: payload has {len(data)} bytes, header says {header.length}")
        start, end = header.offset, header.offset + header.length
        if end > len(state.buffer):
            raise OversizedFrame(f"{where}: bytes [{start}, {end}) fall outside the {len(state.buffer)}-byte stream")
        if state.num_chunks is not None and header.num_chunks != state.num_chunks:
            raise MalformedFrame(
                f"{where}: num_chunks {header.num_chunks} disagrees with earlier frames ({state.num_chunks})"
            )
        if header.chunk_index in state.chunks:
            raise DuplicateFrame(f"{where}: duplicate chunk (already received)")
        if end > start:
            position = bisect_left(state.starts, start)
            if (position > 0 and state.ends[position - 1] > start) or (
                position < len(state.starts) and state.starts[position] < end
            ):
                raise MalformedFrame(f"{where}: bytes [{start}, {end}) overlap bytes already received")
        if len(state.chunks) + 1 == header.num_chunks and state.received + header.length != len(state.buffer):
            raise MalformedFrame(
                f"{where}: the last chunk would leave the stream with {state.received + header.length} "
                f"of {len(state.buffer)} bytes"
            )
        if len(state.chunks) + 1 < header.num_chunks and state.received + header.length == len(state.buffer) > 0:
            raise MalformedFrame(f"{where}: the stream would be full before all {header.num_chunks} chunks arrived")
        return state
