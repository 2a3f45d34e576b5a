"""Reception of one request's KV in segments of its tokens, plus its metadata (aux).

A long prompt's KV travels in segments (`lynx.kvwire.WireFormat.segments`),
each sent as soon as the prefill has computed it; every segment has the
mode's streams (anchor first), and the request's metadata is one more stream.
`SegmentedAssembly` routes each frame to the `RequestAssembly` of its segment,
so a segment's anchor can be written into its slots as soon as it is whole.
It also records which segments' anchors have been written (by the receiver's
data thread) and how far each residual is applied: a residual is applied a
few layers at a time, by whichever thread holds the room's upgrade fence
(`lynx.transfer.rooms.RoomTable.upgrading`).
"""

from __future__ import annotations

from collections.abc import Sequence

from lynx.transfer.frames import AUX_STREAM, FrameHeader, MalformedFrame
from lynx.transfer.reassembly import RequestAssembly


class SegmentedAssembly:
    """The streams of one request.

    Args:
        room: the request's transfer id.
        segment_sizes: per segment, the byte size of each of its streams (anchor first).
        aux_size: bytes of the request metadata.
    """

    def __init__(self, room: int, segment_sizes: Sequence[Sequence[int]], aux_size: int) -> None:
        if not segment_sizes:
            raise ValueError("a request has at least one segment")
        self.room = room
        self.parts = [RequestAssembly(room, dict(enumerate(sizes))) for sizes in segment_sizes]
        self.aux = RequestAssembly(room, {AUX_STREAM: aux_size})
        self.num_streams = len(segment_sizes[0])
        self.anchors_written: set[int] = set()
        self.residuals_applied: set[int] = set()
        self.layers_applied: dict[int, int] = {}  # segment -> layers upgraded so far, while partly

    @property
    def num_segments(self) -> int:
        return len(self.parts)

    def accept(self, header: FrameHeader, payload) -> None:
        """Place one frame; raises what `RequestAssembly.accept` raises, or MalformedFrame for a bad segment."""
        if header.stream == AUX_STREAM:
            if header.segment != 0:
                raise MalformedFrame(f"request metadata travels in segment 0, not {header.segment}")
            self.aux.accept(header, payload)
            return
        if header.segment >= len(self.parts):
            raise MalformedFrame(f"segment {header.segment} of a request with {len(self.parts)} segments")
        self.parts[header.segment].accept(header, payload)

    def anchor_ready(self, segment: int) -> bool:
        return self.parts[segment].is_complete(0)

    def segment_ready(self, segment: int) -> bool:
        """Whether every stream of `segment` has arrived."""
        return self.parts[segment].ready(range(self.num_streams))

    def upgradable(self) -> list[int]:
        """Segments whose anchor is written and whose every stream has landed, but whose
        residual is not applied yet, in order."""
        return [k for k in sorted(self.anchors_written - self.residuals_applied) if self.segment_ready(k)]

    @property
    def aux_ready(self) -> bool:
        return self.aux.is_complete(AUX_STREAM)

    @property
    def all_ready(self) -> bool:
        return self.aux_ready and all(self.segment_ready(k) for k in range(len(self.parts)))

    def buffer(self, segment: int, stream: int):
        return self.parts[segment].buffer(stream)

    def aux_buffer(self):
        return self.aux.buffer(AUX_STREAM)
