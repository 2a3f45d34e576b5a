"""The receiving side's room table: every `Room` of one rank, every transition under its one lock.

A room's lifecycle (its states, transition table and `advance`) is in
`lynx.transfer.room_lifecycle`; this table decides when a room moves and makes
every move, under one lock, with one clock for every deadline: a no-progress
deadline per room (armed with the manifest, pushed back by the room's own
progress) and a cap per transfer. Its two fences, `writing` (an anchor write)
and `upgrading` (a residual rewriting anchor-only slots), count the threads
inside a room's slots (`Room.inside`); a release waits until none is.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

from lynx.transfer.room_lifecycle import Owner, Placement, Room, RoomState, advance


class DuplicateRoom(ValueError):
    """A live room with this id exists already; the first one keeps it."""


class RoomTable:
    """The rooms of one receiving rank.

    Args:
        timeout: seconds without progress after which a receiving room fails.
        clock: seconds, monotonic; the one clock of every deadline.
    """

    def __init__(self, timeout: float, clock: Callable[[], float] = time.monotonic) -> None:
        if not timeout > 0:
            raise ValueError(f"timeout must be > 0 seconds, got {timeout!r}")
        self.timeout = float(timeout)
        self.clock = clock
        self._rooms: dict[int, Room] = {}
        self._cond = threading.Condition()

    # --- reading ---------------------------------------------------------------------------

    def get(self, room: int) -> Room | None:
        with self._cond:
            return self._rooms.get(room)

    def state(self, room: int) -> RoomState | None:
        entry = self.get(room)
        return None if entry is None else entry.state

    def live(self) -> list[int]:
        """Rooms not yet ended."""
        with self._cond:
            return [r for r, e in self._rooms.items() if e.state.live]

    def count_by_state(self) -> dict[str, int]:
        """How many rooms are in each state (states with none left out)."""
        with self._cond:
            return dict(Counter(entry.state.value for entry in self._rooms.values()))

    def rooms_of(self, peer: str) -> list[int]:
        with self._cond:
            return [r for r, e in self._rooms.items() if e.peer == peer and e.state.live]

    def __len__(self) -> int:
        with self._cond:
            return len(self._rooms)

    def timings(self, room: int) -> dict[str, float]:
        with self._cond:
            entry = self._rooms.get(room)
            return {} if entry is None else {k: round(v, 6) for k, v in entry.timings.items()}

    def anchored(self, room: int) -> bool:
        """Whether the room's anchor is in its slots (and it did not fail)."""
        with self._cond:
            entry = self._rooms.get(room)
            return entry is not None and entry.state.anchor_in

    def if_all_anchored(self, rooms: Sequence[int], report: Callable[[], None]) -> bool:
        """Call ``report()`` if every one of `rooms` (the parts of one request, `lynx.transfer.parts`)
        is ANCHORED (or further), under the table's lock.

        A `close` of any of them therefore either comes first (nothing is
        reported) or waits until the report is made: once the consumer has
        released a room, no report of its anchor can follow (and promote a
        later request that reuses the room id). `report` must not call back
        into this table.
        """
        with self._cond:
            entries = [self._rooms.get(room) for room in rooms]
            if not all(entry is not None and entry.state.anchor_in for entry in entries):
                return False
            report()
            return True

    # --- transitions -----------------------------------------------------------------------

    def _move(self, entry: Room, to: RoomState) -> None:
        """Every change of a room's state: `advance` checks it against the table. Holds the lock."""
        entry.state = advance(entry.state, to)
        self._cond.notify_all()

    def reserve(self, entry: Room) -> Room:
        """Add a new (RESERVED) room; DuplicateRoom if a live room has its id (a dead one is replaced)."""
        if entry.state is not RoomState.RESERVED:
            raise ValueError(f"room {entry.room} is not a new room ({entry.state.value})")
        with self._cond:
            old = self._rooms.get(entry.room)
            if old is not None and old.state.live:
                raise DuplicateRoom(
                    f"transfer id (bootstrap_room) {entry.room} is already in use by a live request; "
                    "each request needs its own bootstrap_room"
                )
            self._rooms[entry.room] = entry
            return entry

    def start_receiving(
        self, room: int, manifest, assembly, *, cap_s: float | None = None, placement: Placement | None = None
    ) -> str | None:
        """RESERVED -> RECEIVING with the accepted manifest, its `placement` and the `assembly` of its
        streams; arms the deadline, and the cap `cap_s` seconds from now.

        Returns why the room cannot start receiving (then nothing changed), or None.
        """
        with self._cond:
            entry = self._rooms.get(room)
            if entry is None or entry.state is not RoomState.RESERVED:
                what = "not reserved" if entry is None else f"already {entry.state.value}"
                return f"a manifest for room {room}, which is {what}: ignored (replayed or late)"
            entry.manifest, entry.assembly, entry.placement = manifest, assembly, placement
            self._move(entry, RoomState.RECEIVING)
            now = self.clock()
            entry.cap = None if cap_s is None else now + cap_s
            entry.deadline = entry.next_deadline(now, self.timeout)
            entry.timings["manifest_s"] = now - entry.since
            entry.timings["transferred_tokens"] = entry.num_tokens
            return None

    def arm(self, room: int) -> None:
        """Start the no-progress deadline of a RESERVED room (another part of its request started)."""
        with self._cond:
            entry = self._rooms.get(room)
            if entry is not None and entry.state is RoomState.RESERVED and entry.deadline is None:
                entry.deadline = self.clock() + self.timeout

    def progress(self, room: int, alive: int | None = None) -> bool:
        """Something of the room was accepted: push back its deadline (never past its cap). For an
        alive message, `alive` is its counter: it must be above every one accepted for the room
        before, else nothing changes (a replayed or older one) and False is returned."""
        with self._cond:
            entry = self._rooms.get(room)
            if entry is None or not entry.state.live or (alive is not None and alive <= entry.alive_counter):
                return False
            entry.alive_counter = entry.alive_counter if alive is None else alive
            if entry.deadline is not None:
                entry.deadline = entry.next_deadline(self.clock(), self.timeout)
            return True

    @contextmanager
    def writing(self, room: int, final: bool = True) -> Iterator[bool]:
        """Fence a write into the room's slots: yields True if the room may be written (it is RECEIVING).

        While inside, a release waits (the room is ``CLOSING``) and `fail`
        only marks the room. On exit the room is ANCHORED if this was its
        `final` anchor write (else RECEIVING again, for the next segment),
        FAILED if a failure was recorded meanwhile, or left to the waiting
        release (`anchored` tells).
        """
        with self._cond:
            entry = self._rooms.get(room)
            allowed = entry is not None and entry.state is RoomState.RECEIVING
            if allowed:
                self._move(entry, RoomState.WRITING)
                entry.inside += 1
        try:
            yield allowed
        finally:
            if allowed:
                with self._cond:
                    entry.inside -= 1
                    if entry.state is RoomState.CLOSING:
                        self._cond.notify_all()  # released meanwhile: never reported anchored
                    elif entry.failure is not None:
                        self._move(entry, RoomState.FAILED)
                    elif final:
                        entry.timings["anchor_ready_s"] = self.clock() - entry.since
                        self._move(entry, RoomState.ANCHORED)
                    else:
                        self._move(entry, RoomState.RECEIVING)

    @contextmanager
    def upgrading(self, room: int) -> Iterator[Room | None]:
        """Fence an upgrade of the room's slots: yields the room if they may be upgraded (it is
        live, receiving or past its anchor), else None.

        Waits while another thread upgrades the room (`Room.upgrade_turn`), so
        its two upgraders (the receiver's data thread between messages, the
        consumer before it reads the slots) take turns. The state stays as it
        is; while inside, a release waits and `fail` marks the room failed (its
        slots stay reserved until the release).
        """
        entry = self.get(room)
        if entry is None:
            yield None
            return
        with entry.upgrade_turn:
            with self._cond:
                allowed = entry.state.upgradable
                if allowed:
                    entry.inside += 1
            try:
                yield entry if allowed else None
            finally:
                if allowed:
                    with self._cond:
                        entry.inside -= 1
                        self._cond.notify_all()

    def all_landed(self, room: int, complete: bool) -> None:
        """Every stream arrived: ANCHORED -> LANDED, or COMPLETE when nothing is left to apply."""
        with self._cond:
            entry = self._rooms.get(room)
            if entry is None or entry.state is not RoomState.ANCHORED:
                return
            entry.timings.setdefault("residual_ready_s", self.clock() - entry.since)
            entry.deadline = None
            self._move(entry, RoomState.COMPLETE if complete else RoomState.LANDED)
            if complete:
                entry.assembly = None

    def take_landed(self, room: int) -> Room | None:
        """LANDED -> COMPLETE: the room (with its assembly) for its consumer to apply, once."""
        with self._cond:
            entry = self._rooms.get(room)
            if entry is None or entry.state is not RoomState.LANDED:
                return None
            self._move(entry, RoomState.COMPLETE)
            return entry

    def fail(self, room: int, reason: str) -> bool:
        """Any live state -> FAILED with ``reason`` (during a write: when the write ends).

        Returns False if the room is unknown or already ended.
        """
        with self._cond:
            entry = self._rooms.get(room)
            if entry is None or not entry.state.live or entry.failure is not None:
                return False
            self._fail(entry, reason)
            return True

    def expire(self, room: int) -> str | None:
        """Fail the room if its deadline has passed; the failure reason, if it has failed."""
        with self._cond:
            entry = self._rooms.get(room)
            if entry is None:
                return None
            now = self.clock()
            if entry.deadline is not None and entry.state.live and now > entry.deadline:
                self._fail(entry, entry.expiry(now, self.timeout))
            return entry.failure

    def _fail(self, entry: Room, reason: str) -> None:
        entry.failure, entry.deadline = reason, None
        if entry.state is RoomState.WRITING:
            self._cond.notify_all()  # the write in progress fails the room when it ends
        else:
            self._move(entry, RoomState.FAILED)

    def hand_over(self, room: int) -> Room | None:
        """The consumer owns the room from now on (the transfer's `release` no longer drops it)."""
        with self._cond:
            entry = self._rooms.get(room)
            if entry is not None:
                entry.owner = Owner.CONSUMER
            return entry

    def close(self, room: int, owner: Owner | None = None) -> Room | None:
        """Release the room and drop it: a live room is CLOSING until nobody is inside its slots
        (a write or an upgrade in progress), then CLOSED; returns it (None if unknown).

        With ``owner``, only a room of that owner is dropped. Afterwards nothing
        writes into the room's slots: the caller may free them.
        """
        with self._cond:
            entry = self._rooms.get(room)
            if entry is None or (owner is not None and entry.owner is not owner):
                return None
            if entry.state.live:
                self._move(entry, RoomState.CLOSING)
            self._cond.wait_for(lambda: entry.inside == 0)
            if entry.state is RoomState.CLOSING:
                self._move(entry, RoomState.CLOSED)
            entry.assembly = None
            if self._rooms.get(room) is entry:
                del self._rooms[room]
            return entry
