"""The receiving side's state machine: one `Room` per request whose KV slots a rank reserved.

Every transition happens in `RoomTable`, under its one lock, and every
deadline is measured with its one clock. The states, in order:

* ``RESERVED``: slots reserved and a transfer nonce issued; waiting for the
  sender's manifest. No Lynx deadline yet: the prefill may queue or compute
  for minutes (the serving engine's own waiting timeout applies), unless
  another part of the same request has started (`arm`).
* ``RECEIVING``: the manifest was accepted; frames are arriving. Two
  deadlines run: ``timeout`` seconds without progress of the room itself
  (its manifest, its frames, a fresh alive message from its sender:
  `progress`) fail it, and so does its cap, a bound on the whole
  transfer set from the manifest (`start_receiving`).
* ``WRITING``: the receiver is writing the anchor into the slots. Closing a
  room waits for the write to end, so slots are never freed under a writer.
  Upgrades (a landed residual rewriting anchor-only slots) are fenced the
  same way (`upgrading`) but leave the state alone: they happen in
  ``RECEIVING``, ``ANCHORED`` and ``LANDED``, one thread at a time.
* ``ANCHORED``: the anchor is in the slots; later streams are still arriving.
* ``LANDED``: every stream has arrived; the consumer takes the rest of the KV.
* ``COMPLETE``: all of the KV is in the slots.
* ``FAILED`` (terminal, with ``failure``) and ``CLOSED`` (released by its
  consumer): nothing is written any more.

A room is owned by the transfer (``owner = "transfer"``) until the consumer
takes it over (``hand_over``); `release` by the transfer then leaves it alone.
"""

from __future__ import annotations

import enum
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np


class RoomState(enum.Enum):
    RESERVED = "reserved"
    RECEIVING = "receiving"
    WRITING = "writing"
    ANCHORED = "anchored"
    LANDED = "landed"
    COMPLETE = "complete"
    FAILED = "failed"
    CLOSED = "closed"


LIVE = frozenset(set(RoomState) - {RoomState.FAILED, RoomState.CLOSED})


class DuplicateRoom(ValueError):
    """A live room with this id exists already; the first one keeps it."""


@dataclass
class Room:
    """One reserved transfer.

    Attributes:
        room: the request's transfer id.
        slots: destination KV slots, in token order; their count is exactly
            the number of tokens the sender must announce.
        aux_index: the request's metadata row.
        key: MAC key of this transfer (``lynx.transfer.keys.transfer_key``).
        since: clock time the request arrived (timings are measured from it).
        peer: who sends (e.g. the prefill's bootstrap address), for failing
            every room of a lost peer.
        state, failure: see the module docstring.
        deadline: clock time at which the room fails for lack of progress;
            None while no deadline is armed.
        cap: clock time by which the whole transfer must have landed (set
            with the manifest); None without one.
        alive_counter: the counter of the last alive message accepted for
            the room (`RoomTable.progress`); -1 before the first.
        assembly: the streams being received: set with the manifest, kept
            until the room is closed (or complete), whatever fails meanwhile.
        manifest: the accepted manifest.
        timings: seconds from ``since`` to ``manifest_s``, ``anchor_ready_s``,
            ``residual_ready_s``.
        owner: ``"transfer"`` or ``"consumer"`` (after `RoomTable.hand_over`).
        closing: a `close` is waiting for a write or an upgrade to end.
        upgrading: a thread is upgrading the room's slots (`RoomTable.upgrading`).
        extra: free for the embedding engine (e.g. peer endpoints to notify).
    """

    room: int
    slots: np.ndarray
    aux_index: int
    key: bytes
    since: float
    peer: str = ""
    state: RoomState = RoomState.RESERVED
    failure: str | None = None
    deadline: float | None = None
    cap: float | None = None
    alive_counter: int = -1
    assembly: object | None = None
    manifest: object | None = None
    timings: dict[str, float] = field(default_factory=dict)
    owner: str = "transfer"
    closing: bool = False
    upgrading: bool = False
    extra: dict = field(default_factory=dict)

    @property
    def num_tokens(self) -> int:
        return len(self.slots)


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
        with self._cond:
            entry = self._rooms.get(room)
            return None if entry is None else entry.state

    def live(self) -> list[int]:
        """Rooms not yet ended."""
        with self._cond:
            return [r for r, e in self._rooms.items() if e.state in LIVE]

    def count_by_state(self) -> dict[str, int]:
        """How many rooms are in each state (states with none left out)."""
        with self._cond:
            counts: dict[str, int] = {}
            for entry in self._rooms.values():
                counts[entry.state.value] = counts.get(entry.state.value, 0) + 1
            return counts

    def rooms_of(self, peer: str) -> list[int]:
        with self._cond:
            return [r for r, e in self._rooms.items() if e.peer == peer and e.state in LIVE]

    def __len__(self) -> int:
        with self._cond:
            return len(self._rooms)

    def timings(self, room: int) -> dict[str, float]:
        with self._cond:
            entry = self._rooms.get(room)
            return {} if entry is None else {k: round(v, 6) for k, v in entry.timings.items()}

    # --- transitions -----------------------------------------------------------------------

    def reserve(self, entry: Room) -> Room:
        """Add a RESERVED room; DuplicateRoom if a live room has its id (a dead one is replaced)."""
        with self._cond:
            old = self._rooms.get(entry.room)
            if old is not None and old.state in LIVE:
                raise DuplicateRoom(
                    f"transfer id (bootstrap_room) {entry.room} is already in use by a live request; "
                    "each request needs its own bootstrap_room"
                )
            entry.state, entry.deadline = RoomState.RESERVED, None
            self._rooms[entry.room] = entry
            return entry

    def start_receiving(
        self, room: int, manifest, assembly, *, cap_s: float | None = None, extra: Mapping | None = None
    ) -> str | None:
        """RESERVED -> RECEIVING with the accepted manifest; arms the deadline, and the cap
        `cap_s` seconds from now; `extra` goes into `Room.extra` (what the manifest placed).

        Returns why the room cannot start receiving (then nothing changed), or None.
        """
        with self._cond:
            entry = self._rooms.get(room)
            if entry is None or entry.state is not RoomState.RESERVED:
                what = "not reserved" if entry is None else f"already {entry.state.value}"
                return f"a manifest for room {room}, which is {what}: ignored (replayed or late)"
            entry.manifest, entry.assembly = manifest, assembly
            entry.extra.update(extra or {})
            entry.state = RoomState.RECEIVING
            now = self.clock()
            entry.cap = None if cap_s is None else now + cap_s
            entry.deadline = self._next_deadline(entry, now)
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
            if entry is None or entry.state not in LIVE or (alive is not None and alive <= entry.alive_counter):
                return False
            entry.alive_counter = entry.alive_counter if alive is None else alive
            if entry.deadline is not None:
                entry.deadline = self._next_deadline(entry, self.clock())
            return True

    def _next_deadline(self, entry: Room, now: float) -> float:
        deadline = now + self.timeout
        return deadline if entry.cap is None else min(deadline, entry.cap)

    @contextmanager
    def writing(self, room: int, final: bool = True) -> Iterator[bool]:
        """Fence a write into the room's slots: yields True if the room may be written (it is RECEIVING).

        While inside, `close` waits and `fail` only marks the room. On exit the
        room is ANCHORED if this was its `final` anchor write (else RECEIVING
        again, for the next segment), FAILED if a failure was recorded
        meanwhile, or CLOSED if a `close` waits for it (`anchored` tells).
        """
        with self._cond:
            entry = self._rooms.get(room)
            allowed = entry is not None and entry.state is RoomState.RECEIVING and not entry.closing
            if allowed:
                entry.state = RoomState.WRITING
        try:
            yield allowed
        finally:
            if allowed:
                with self._cond:
                    if entry.failure is not None:
                        entry.state = RoomState.FAILED
                    elif entry.closing:
                        entry.state = RoomState.CLOSED  # released meanwhile: never reported anchored
                    elif final:
                        entry.timings["anchor_ready_s"] = self.clock() - entry.since
                        entry.state = RoomState.ANCHORED
                    else:
                        entry.state = RoomState.RECEIVING
                    self._cond.notify_all()

    @contextmanager
    def upgrading(self, room: int) -> Iterator[Room | None]:
        """Fence an upgrade of the room's slots: yields the room if they may be upgraded (it is
        live, receiving or past its anchor, and not closing), else None.

        Waits while another thread upgrades the room, so its two upgraders (the
        receiver's data thread between messages, the consumer before it reads
        the slots) take turns. While inside, `close` waits and `fail` marks the
        room failed (its slots stay reserved until the close).
        """
        with self._cond:
            entry = self._rooms.get(room)
            self._cond.wait_for(lambda: entry is None or not entry.upgrading)
            upgradable = (RoomState.RECEIVING, RoomState.ANCHORED, RoomState.LANDED)
            allowed = entry is not None and entry.state in upgradable and not entry.closing
            if allowed:
                entry.upgrading = True
        try:
            yield entry if allowed else None
        finally:
            if allowed:
                with self._cond:
                    entry.upgrading = False
                    self._cond.notify_all()

    def anchored(self, room: int) -> bool:
        """Whether the room's anchor is in its slots (and it did not fail)."""
        with self._cond:
            entry = self._rooms.get(room)
            return entry is not None and entry.state in (RoomState.ANCHORED, RoomState.LANDED, RoomState.COMPLETE)

    def if_anchored(self, room: int, report: Callable[[int], None]) -> bool:
        """Call ``report(room)`` if the room is ANCHORED (or further), under the table's lock.

        A `close` therefore either comes first (nothing is reported) or waits
        until the report is made: once the consumer has released the room, no
        report of its anchor can follow (and promote a later request that reuses
        the room id). `report` must not call back into this table.
        """
        return self.if_all_anchored((room,), lambda: report(room))

    def if_all_anchored(self, rooms: Sequence[int], report: Callable[[], None]) -> bool:
        """Call ``report()`` if every one of `rooms` (the parts of one request, `lynx.transfer.parts`)
        is ANCHORED (or further), under the table's lock, as `if_anchored` does for one room: a
        `close` of any part either comes first (nothing is reported) or waits for the report."""
        with self._cond:
            for room in rooms:
                entry = self._rooms.get(room)
                if entry is None or entry.state not in (RoomState.ANCHORED, RoomState.LANDED, RoomState.COMPLETE):
                    return False
            report()
            return True

    def all_landed(self, room: int, complete: bool) -> None:
        """Every stream arrived: ANCHORED -> LANDED, or COMPLETE when nothing is left to apply."""
        with self._cond:
            entry = self._rooms.get(room)
            if entry is None or entry.state is not RoomState.ANCHORED:
                return
            entry.timings.setdefault("residual_ready_s", self.clock() - entry.since)
            entry.deadline = None
            entry.state = RoomState.COMPLETE if complete else RoomState.LANDED
            if complete:
                entry.assembly = None
            self._cond.notify_all()

    def take_landed(self, room: int) -> Room | None:
        """LANDED -> COMPLETE: the room (with its assembly) for its consumer to apply, once."""
        with self._cond:
            entry = self._rooms.get(room)
            if entry is None or entry.state is not RoomState.LANDED:
                return None
            entry.state = RoomState.COMPLETE
            return entry

    def fail(self, room: int, reason: str) -> bool:
        """Any live state -> FAILED with ``reason`` (during a write: when the write ends).

        Returns False if the room is unknown or already ended.
        """
        with self._cond:
            entry = self._rooms.get(room)
            if entry is None or entry.state not in LIVE or entry.failure is not None:
                return False
            entry.failure, entry.deadline = reason, None
            if entry.state is not RoomState.WRITING:
                entry.state = RoomState.FAILED
            self._cond.notify_all()
            return True

    def expire(self, room: int) -> str | None:
        """Fail the room if its deadline has passed; the failure reason, if it has failed."""
        with self._cond:
            entry = self._rooms.get(room)
            if entry is None:
                return None
            now = self.clock()
            if entry.deadline is not None and entry.state in LIVE and now > entry.deadline:
                reason = self._expiry(entry, now)
                entry.failure, entry.deadline = reason, None
                if entry.state is not RoomState.WRITING:
                    entry.state = RoomState.FAILED
                self._cond.notify_all()
            return entry.failure

    def _expiry(self, entry: Room, now: float) -> str:
        if entry.cap is not None and now > entry.cap:
            allowed = entry.cap - entry.since - entry.timings["manifest_s"]
            return (
                f"KV of the request did not all arrive within {allowed:.0f}s of its announcement, the most "
                "its frames may take at one --lynx-transfer-timeout each; is the prefill server sending it?"
            )
        return (
            f"KV of the request made no progress for {self.timeout:g}s "
            "(--lynx-transfer-timeout); is the prefill server alive and the link up?"
        )

    def hand_over(self, room: int) -> Room | None:
        """The consumer owns the room from now on (the transfer's `release` no longer drops it)."""
        with self._cond:
            entry = self._rooms.get(room)
            if entry is not None:
                entry.owner = "consumer"
            return entry

    def close(self, room: int, owner: str | None = None) -> Room | None:
        """End the room and drop it, waiting for a write in progress; returns it (None if unknown).

        With ``owner``, only a room of that owner is dropped. Afterwards nothing
        writes into the room's slots: the caller may free them.
        """
        with self._cond:
            entry = self._rooms.get(room)
            if entry is None or (owner is not None and entry.owner != owner):
                return None
            entry.closing = True
            self._cond.wait_for(lambda: entry.state is not RoomState.WRITING and not entry.upgrading)
            if entry.state in LIVE:
                entry.state = RoomState.CLOSED
            entry.assembly = None
            if self._rooms.get(room) is entry:
                del self._rooms[room]
            return entry
