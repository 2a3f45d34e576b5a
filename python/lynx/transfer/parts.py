"""Requests whose KV arrives in parts: one `Room` of a `RoomTable` per sender.

Under tensor parallelism a receiving rank may hold heads that several sending
ranks hold between them; each sender's share is its own room (its own
manifest, frames and state machine) under its own wire id
(`lynx.heads.transfer_room`; part 0 keeps the request's id). `PartedRooms`
answers for the request as a whole: its state is its least advanced part's
(FAILED if any part failed), its milestones its last part's, and failing or
closing it fails or closes every part; once one part starts receiving, every
part's deadline runs. A request of one part is just its room.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

from lynx.transfer.room_lifecycle import Owner, Placement, Room, RoomState
from lynx.transfer.rooms import DuplicateRoom, RoomTable

_ORDER = [
    RoomState.RESERVED, RoomState.RECEIVING, RoomState.WRITING, RoomState.ANCHORED, RoomState.LANDED,
    RoomState.COMPLETE, RoomState.CLOSING, RoomState.CLOSED,
]  # fmt: skip


class PartedRooms:
    """The requests of one receiving rank, over its room table (which keeps every transition)."""

    def __init__(self, table: RoomTable) -> None:
        self.table = table
        self._parts: dict[int, tuple[int, ...]] = {}
        self._lock = threading.Lock()

    def reserve(self, request: int, rooms: Sequence[Room]) -> None:
        """Reserve the parts of `request` (their ids distinct), numbered in order (`Room.request`,
        `Room.part`); DuplicateRoom, and none reserved, if one is live."""
        reserved: list[int] = []
        try:
            for part, entry in enumerate(rooms):
                entry.request, entry.part = request, part
                self.table.reserve(entry)
                reserved.append(entry.room)
        except DuplicateRoom:
            for wire in reserved:
                self.table.close(wire)
            raise
        with self._lock:
            self._parts[request] = tuple(reserved)

    def parts(self, request: int) -> tuple[int, ...]:
        """The rooms of `request` (the request's own id alone if it was not reserved in parts)."""
        with self._lock:
            return self._parts.get(request, (request,))

    def entries(self, request: int) -> list[Room | None]:
        return [self.table.get(wire) for wire in self.parts(request)]

    def request_of(self, wire: int) -> int:
        """The request a part's room belongs to (`wire` itself if unknown)."""
        entry = self.table.get(wire)
        return wire if entry is None else entry.request

    def state(self, request: int) -> RoomState | None:
        """FAILED if a part failed, else the least advanced part's state; None once a part is gone."""
        states = [self.table.state(wire) for wire in self.parts(request)]
        if None in states:
            return None
        if RoomState.FAILED in states:
            return RoomState.FAILED
        return min(states, key=_ORDER.index)

    def start_receiving(
        self, wire: int, manifest, assembly, *, cap_s: float | None = None, placement: Placement | None = None
    ) -> str | None:
        """`RoomTable.start_receiving` of one part; once one starts, every part of its request is
        armed (`RoomTable.arm`): a part that never announces fails the request in time."""
        problem = self.table.start_receiving(wire, manifest, assembly, cap_s=cap_s, placement=placement)
        if problem is None:
            for other in self.parts(self.request_of(wire)):
                self.table.arm(other)
        return problem

    def anchored(self, request: int) -> bool:
        return all(self.table.anchored(wire) for wire in self.parts(request))

    def if_anchored(self, request: int, report: Callable[[int], None]) -> bool:
        """Call ``report(request)`` if every part is anchored, under the table's lock
        (`RoomTable.if_all_anchored`): no report follows a close of any part."""
        return self.table.if_all_anchored(self.parts(request), lambda: report(request))

    def timings(self, request: int) -> dict[str, float]:
        """Each milestone of the request: its last part's."""
        merged: dict[str, float] = {}
        for wire in self.parts(request):
            for name, value in self.table.timings(wire).items():
                merged[name] = max(value, merged.get(name, value))
        return merged

    def live_requests(self) -> int:
        """Requests with a live part."""
        return len({self.request_of(wire) for wire in self.table.live()})

    def fail(self, request: int, reason: str) -> bool:
        """Fail every part of the request; whether any part was live."""
        return any([self.table.fail(wire, reason) for wire in self.parts(request)])

    def expire(self, request: int) -> str | None:
        """The request's failure, a part's deadline having passed or not (then every part fails), or None."""
        for wire in self.parts(request):
            reason = self.table.expire(wire)
            if reason is not None:
                self.fail(request, reason)
                return reason
        return None

    def hand_over(self, request: int) -> None:
        for wire in self.parts(request):
            self.table.hand_over(wire)

    def close(self, request: int, owner: Owner | None = None) -> list[Room]:
        """Close every part (of `owner` only, if given; see `RoomTable.close`); the closed ones.
        The request is forgotten once none of its parts is left."""
        wires = self.parts(request)
        closed = [entry for wire in wires if (entry := self.table.close(wire, owner=owner)) is not None]
        if all(self.table.get(wire) is None for wire in wires):
            with self._lock:
                self._parts.pop(request, None)
        return closed
