"""Writing a decode room's received KV into its slots, inside the room table's fences.

`SlotWriter` writes each segment's anchor, and then the request metadata that
completes the anchor, inside the table's write fence (`RoomTable.writing`:
whoever releases the room waits for the write, and a failed or closing room
is never written). Under tensor parallelism a room (one part of a request)
is written into the KV heads its manifest placed (`Room.placement`), and
only part 0 writes the metadata row.

In ``lynx`` mode the residual keeps streaming in after the anchor. Each
segment whose residual has landed (and whose anchor is written) is upgraded
in place, the anchor-only slots rewritten with the reconstruction from every
stream: by the data thread in the gaps between messages, one layer a step
(`step`), so an upgrade never holds up a message for more than one layer's
work; and once every stream has landed, whatever is left by the scheduler
thread before it verifies (`apply`). Every upgrade holds the room's upgrade
fence (`RoomTable.upgrading`), so the two take turns.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import NamedTuple

import numpy as np
import torch
from lynx.kvwire import KVShape, WireFormat
from lynx.transfer.room_lifecycle import Room, RoomState
from lynx.transfer.rooms import RoomTable
from lynx.transfer.segments import SegmentedAssembly

from lynx.pd.pool import PoolView

UPGRADE_LAYERS_PER_STEP = 1  # between two looks for a waiting message


class SegmentTarget(NamedTuple):
    """Where one segment of a room goes: its shape, the room's K and V buffers (one per layer),
    the pool index of the segment's slots."""

    shape: KVShape
    k_buffers: tuple[torch.Tensor, ...]
    v_buffers: tuple[torch.Tensor, ...]
    index: torch.Tensor


class SlotWriter:
    """Writes the rooms of one decode rank into its pool.

    Args:
        table: the rank's room table (its write and upgrade fences).
        pool: returns the rank's pool view (waiting until there is one).
        wires: the wire formats a manifest may name, by mode.
    """

    def __init__(self, table: RoomTable, pool: Callable[[], PoolView], wires: Mapping[str, WireFormat]) -> None:
        self._table, self._pool, self._wires = table, pool, wires
        self._waiting: dict[int, None] = {}  # rooms with a landed residual to upgrade, in order (data thread)

    # --- anchors (data thread) ----------------------------------------------------------------

    def land_anchors(self, entry: Room, assembly: SegmentedAssembly) -> bool:
        """Write every segment whose anchor is whole into its slots; with the last one and the
        metadata in, the room is anchored: True (once, by the write that anchors it)."""
        for k in range(assembly.num_segments):
            if k not in assembly.anchors_written and assembly.anchor_ready(k):
                if not self._write(entry, assembly, k):
                    return False
        if len(assembly.anchors_written) == assembly.num_segments and assembly.aux_ready:
            return self._write(entry, assembly, None)
        return False

    def _write(self, entry: Room, assembly: SegmentedAssembly, segment: int | None) -> bool:
        """Inside the room's write fence: one segment's anchor into the room's heads, or (None)
        the metadata (part 0's; every part's completes its anchor). False if the room may not be
        written any more."""
        pool = self._pool()
        with self._table.writing(entry.room, final=segment is None) as allowed:
            if allowed and segment is not None:
                target = self.target(entry, segment)
                anchor = [as_tensor(assembly.buffer(segment, 0))]
                self._wire(entry).write(anchor, target.shape, target.k_buffers, target.v_buffers, target.index)
                assembly.anchors_written.add(segment)
            elif allowed and entry.part == 0:
                pool.write_aux(entry.aux_index, assembly.aux_buffer())
            if allowed:
                pool.synchronize()
        return allowed

    # --- residual upgrades ------------------------------------------------------------------

    def want(self, entry: Room, assembly: SegmentedAssembly) -> None:
        """Queue the room for the data thread's upgrades if a residual of it waits to be applied."""
        if assembly.num_streams > 1 and entry.room not in self._waiting and assembly.upgradable():
            self._waiting[entry.room] = None

    @property
    def waiting(self) -> tuple[int, ...]:
        """The rooms queued for upgrades, in order."""
        return tuple(self._waiting)

    def step(self, room: int) -> bool:
        """Upgrade the next layers of `room`'s first waiting segment (the data thread's step);
        whether that applied the segment's whole residual. The room leaves the queue once
        nothing of it waits (or it may no longer be upgraded)."""
        with self._table.upgrading(room) as entry:
            assembly = None if entry is None else entry.assembly
            segments = [] if assembly is None else assembly.upgradable()
            if segments:
                self.upgrade(entry, assembly, segments[0], UPGRADE_LAYERS_PER_STEP)
                self._pool().synchronize()
                remaining = assembly.upgradable()
        if not segments or not remaining:
            del self._waiting[room]
        return bool(segments) and segments[0] in assembly.residuals_applied

    def apply(self, entry: Room) -> bool:
        """Once every stream of the room has landed, upgrade whatever is left of its residual
        (the scheduler thread, before it verifies); True once all of it is applied (the room
        is then COMPLETE), and on every call after that."""
        if entry.state is RoomState.COMPLETE:
            return True
        if entry.state is not RoomState.LANDED:
            return False  # the data thread applies segments as they land
        with self._table.upgrading(entry.room) as held:
            if held is None:
                return False
            assembly = held.assembly  # kept until the room is closed, which waits for this fence
            for k in assembly.upgradable():  # every anchor is written once the room is anchored
                self.upgrade(held, assembly, k)
            if len(assembly.residuals_applied) < assembly.num_segments:
                return False
        return self._table.take_landed(entry.room) is not None

    def upgrade(self, entry: Room, assembly: SegmentedAssembly, segment: int, layers: int | None = None) -> None:
        """Rewrite the next `layers` layers (default: all that are left) of one segment's
        anchor-only slots with the reconstruction from every stream. The caller holds the
        room's upgrade fence."""
        target = self.target(entry, segment)
        first = assembly.layers_applied.get(segment, 0)
        end = len(target.k_buffers) if layers is None else min(first + layers, len(target.k_buffers))
        streams = [as_tensor(assembly.buffer(segment, s)) for s in range(assembly.num_streams)]
        layers_now = range(first, end)
        self._wire(entry).upgrade(streams, target.shape, target.k_buffers, target.v_buffers, target.index, layers_now)
        assembly.layers_applied[segment] = end
        if end == len(target.k_buffers):
            assembly.residuals_applied.add(segment)

    # --- where a segment goes ---------------------------------------------------------------

    def _wire(self, entry: Room) -> WireFormat:
        """The wire format of the room's accepted manifest."""
        return self._wires[entry.manifest.mode]

    def target(self, entry: Room, segment: int) -> SegmentTarget:
        """Where one segment of the room goes (its manifest's placement in this rank's pool)."""
        pool, placement = self._pool(), entry.placement
        shape = placement.segments[segment]
        k_buffers, v_buffers = pool.head_buffers(placement.head_offset, placement.heads)
        return SegmentTarget(shape, k_buffers, v_buffers, pool.slot_index(segment_slots(entry.slots, shape)))


def segment_slots(slots: np.ndarray, shape: KVShape) -> np.ndarray:
    """The slots of one segment (`shape`) of a room whose slots are `slots`."""
    return slots[shape.first_token : shape.first_token + shape.num_tokens]


def as_tensor(buffer) -> torch.Tensor:
    """A uint8 tensor over a received stream buffer (torch.frombuffer refuses empty ones)."""
    view = memoryview(buffer).cast("B")
    return torch.frombuffer(view, dtype=torch.uint8) if len(view) else torch.empty(0, dtype=torch.uint8)
