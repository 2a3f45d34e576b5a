"""One segment's streams while the prefill encoder fills them, layer by layer.

Each distinct head range the segment's decode ranks get has one buffer per
stream, the layers concatenated (`lynx.kvwire`'s layout); each decode rank
has its key, wire id and, per stream, the number of frames handed to the
sender so far. A frame leaves once every byte of it is encoded: the frames are
exactly those the whole stream makes in one piece (`lynx.transfer.chunking`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch
from lynx.heads import HeadSlice
from lynx.kvwire import KVShape, WireFormat
from lynx.transfer.chunking import frames_ready

from lynx.pd.control import RoomMetadata


class Route(NamedTuple):
    """What one decode rank gets of this prefill rank's KV: these heads, as this part of its transfer."""

    heads: HeadSlice
    part: int


@dataclass
class Destination:
    """One decode rank of a segment: its metadata and route, the transfer key and wire id, and how
    many frames of each stream it has been given."""

    meta: RoomMetadata
    route: Route
    key: bytes
    wire: int
    released: list[int]


class Release(NamedTuple):
    """Frames of one stream now final for one decode rank: the arguments of `PrioritySender.submit`
    (``room`` is the part's wire id)."""

    endpoint: str
    room: int
    stream: int
    data: np.ndarray
    layer_bounds: list[int]
    key: bytes
    segment: int
    frames: range


class _Heads(NamedTuple):
    buffers: list[np.ndarray]
    bounds: list[list[int]]


class SegmentStreams:
    """The streams of one segment for its decode ranks, filled layer by layer.

    Args:
        wire: the mode's wire format.
        segment: which segment of the request's tokens this is.
        shapes: the segment's KV shape for each distinct head range its destinations get.
        destinations: the decode ranks, each with a route into `shapes`.
    """

    def __init__(
        self, wire: WireFormat, segment: int, shapes: dict[HeadSlice, KVShape], destinations: list[Destination]
    ) -> None:
        self.segment = segment
        self.destinations = destinations
        self.num_layers = next(iter(shapes.values())).num_layers
        self.layers_done = 0
        self._heads = {
            heads: _Heads([np.empty(size, dtype=np.uint8) for size in wire.stream_sizes(shape)], wire.layer_bounds(shape))
            for heads, shape in shapes.items()
        }

    @property
    def head_ranges(self) -> list[HeadSlice]:
        return list(self._heads)

    def write(self, heads: HeadSlice, layers: int, streams: list[torch.Tensor]) -> None:
        """Store the encoding of layers ``[layers_done, layers)`` of one head range (one tensor per stream)."""
        out = self._heads[heads]
        for buffer, bounds, data in zip(out.buffers, out.bounds, streams, strict=True):
            buffer[bounds[self.layers_done] : bounds[layers]] = data.numpy()

    def release(self, layers: int, chunk_bytes: int) -> list[Release]:
        """Every layer up to `layers` is written: the frames that became final, per destination and
        stream (marked handed over), and the segment is advanced to `layers`."""
        released = []
        for dest in self.destinations:
            out = self._heads[dest.route.heads]
            for stream, (buffer, bounds) in enumerate(zip(out.buffers, out.bounds)):
                ready = frames_ready(len(buffer), chunk_bytes, bounds[layers])
                if ready > dest.released[stream]:
                    frames = range(dest.released[stream], ready)
                    endpoint, segment = dest.meta.data_endpoint, self.segment
                    released.append(Release(endpoint, dest.wire, stream, buffer, bounds, dest.key, segment, frames))
                    dest.released[stream] = ready
        self.layers_done = layers
        return released

    @property
    def done(self) -> bool:
        return self.layers_done == self.num_layers
