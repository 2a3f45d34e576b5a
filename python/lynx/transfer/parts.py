"""Requests whose KV arrives in parts: one `Room` of a `RoomTable` per sender.

Under tensor parallelism a receiving rank may hold heads that several sending
ranks hold between them; each sender's share is its own room (its own
manifest, frames and state machine) under its own wire id
(`lynx.heads.transfer_room`; part 0 keeps the request's id). `PartedRooms`
answers for the request as a whole: its state is its least advanced part's
(FAILED if any part failed), its milestones its last part's, and failing or
closing it fails or closes every part; once one part starts receiving, every
part's deadline runs. A request of one part is just its room.

A request's id has a holder of its own (`Hold`), with a lifetime that is not
its rooms': SGLang's receiver claims the id before its slots are known (to
turn a duplicate away before it touches SGLang's tables), and the consumer
may keep the rooms after the receiver ended. `HOLD_MOVES` is its table;
`PartedRooms._hold` the one place it is applied.
"""

from __future__ import annotations

import enum
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

from lynx.lifecycle import move
from lynx.transfer.room_lifecycle import Owner, Placement, Room, RoomState
from lynx.transfer.rooms import DuplicateRoom, RoomTable

_ORDER = [
    RoomState.RESERVED, RoomState.RECEIVING, RoomState.WRITING, RoomState.ANCHORED, RoomState.LANDED,
    RoomState.COMPLETE, RoomState.CLOSING, RoomState.CLOSED,
]  # fmt: skip

_ENDED = (None, RoomState.FAILED, RoomState.CLOSED)  # a part's states that let a new receiver claim its id


class Hold(enum.Enum):
    """Who holds a request's id on this rank."""

    CLAIMED = "claimed"  # a receiver holds it; no part reserved yet
    RESERVED = "reserved"  # a receiver holds it and its parts
    CONSUMED = "consumed"  # the receiver ended; the consumer keeps the parts it took over
    RELEASED = "released"  # nobody: the request is forgotten


HOLD_MOVES: Mapping[Hold, frozenset[Hold]] = MappingProxyType({
    # A receiver that ends before reserving leaves what a consumer kept of an earlier one (CONSUMED).
    Hold.CLAIMED: frozenset({Hold.RESERVED, Hold.CONSUMED, Hold.RELEASED}),
    Hold.RESERVED: frozenset({Hold.CONSUMED, Hold.RELEASED}),
    Hold.CONSUMED: frozenset({Hold.CLAIMED, Hold.RELEASED}),  # a new receiver, once every part ended
    Hold.RELEASED: frozenset(),
})  # fmt: skip
"""The holds each hold may move to; every other move is refused."""


@dataclass
class _Request:
    request: int
    hold: Hold
    parts: tuple[int, ...] = ()


class PartedRooms:
    """The requests of one receiving rank, over its room table (which keeps every transition)."""

    def __init__(self, table: RoomTable) -> None:
        self.table = table
        self._requests: dict[int, _Request] = {}
        self._lock = threading.Lock()

    def _hold(self, record: _Request, to: Hold) -> None:
        """Move the request's hold (under `_lock`); a released request is forgotten."""
        record.hold = move(HOLD_MOVES, record.hold, to, f"request {record.request}'s hold")
        if to is Hold.RELEASED:
            del self._requests[record.request]

    def hold(self, request: int) -> Hold:
        with self._lock:
            record = self._requests.get(request)
            return Hold.RELEASED if record is None else record.hold

    def claim(self, request: int) -> bool:
        """A new receiver holds `request`'s id; False (nothing changed) while another receiver
        holds it or a room of it is live (a duplicate)."""
        with self._lock:
            record = self._requests.get(request)
            if (record is not None and record.hold is not Hold.CONSUMED) or self._in_use(request):
                return False
            if record is None:
                self._requests[request] = _Request(request, Hold.CLAIMED)
            else:
                self._hold(record, Hold.CLAIMED)
            return True

    def _in_use(self, request: int) -> bool:
        """A part of the request is live or still being released (CLOSING: a writer may be inside)."""
        return any(state not in _ENDED for state in map(self.table.state, self._parts_of(request)))

    def _parts_of(self, request: int) -> tuple[int, ...]:
        """`parts`, under `_lock`."""
        record = self._requests.get(request)
        return record.parts if record is not None and record.parts else (request,)

    def reserve(self, request: int, rooms: Sequence[Room]) -> None:
        """Reserve the parts of the claimed `request` (their ids distinct), numbered in order
        (`Room.request`, `Room.part`); DuplicateRoom, and none reserved, if one is live.

        Raises:
            RefusedTransition: no receiver claimed the request (or it is reserved already).
        """
        with self._lock:
            record = self._requests.get(request) or _Request(request, Hold.RELEASED)
            move(HOLD_MOVES, record.hold, Hold.RESERVED, f"request {request}'s hold")  # refused before any room
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
            record.parts = tuple(reserved)
            self._hold(record, Hold.RESERVED)

    def release(self, request: int) -> list[Room]:
        """The receiver ended: close the parts it still owns (`Owner.TRANSFER`); the ones the
        consumer took over stay the consumer's (CONSUMED) until it closes them. The closed ones."""
        closed = self._close_parts(request, Owner.TRANSFER)
        with self._lock:
            record = self._requests.get(request)
            if record is not None and record.hold is not Hold.CONSUMED:
                left = any(self.table.get(wire) is not None for wire in record.parts)
                self._hold(record, Hold.CONSUMED if left else Hold.RELEASED)
        return closed

    def parts(self, request: int) -> tuple[int, ...]:
        """The rooms of `request` (the request's own id alone if it was not reserved in parts)."""
        with self._lock:
            return self._parts_of(request)

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

    def close(self, request: int) -> list[Room]:
        """The consumer ended the request: close every part; the closed ones. The request is
        forgotten unless a receiver still holds its id (its `release` then forgets it)."""
        closed = self._close_parts(request, None)
        with self._lock:
            record = self._requests.get(request)
            if record is not None and record.hold is Hold.CONSUMED:
                self._hold(record, Hold.RELEASED)
        return closed

    def _close_parts(self, request: int, owner: Owner | None) -> list[Room]:
        return [entry for wire in self.parts(request) if (entry := self.table.close(wire, owner=owner)) is not None]
