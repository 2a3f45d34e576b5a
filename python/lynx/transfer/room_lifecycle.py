"""The lifecycle of one receiving room: the `Room` record, its `RoomState`, changed only by `advance`.

A room is one request's transfer (or one part of it, `lynx.transfer.parts`)
into KV slots a receiving rank reserved. The states, in order:

* ``RESERVED``: slots reserved and a transfer nonce issued; waiting for the
  sender's manifest. No deadline yet: the prefill may queue or compute for
  minutes (the serving engine's own waiting timeout applies), unless another
  part of the same request has started (`RoomTable.arm`).
* ``RECEIVING``: the manifest was accepted; frames are arriving. Two
  deadlines run: ``timeout`` seconds without progress of the room itself
  (its manifest, its frames, a fresh alive message from its sender) fail it,
  and so does its cap, a bound on the whole transfer set from the manifest.
* ``WRITING``: the receiver is writing into the slots (a segment's anchor, or
  the metadata that completes the anchor). A write ends ``RECEIVING`` again
  (more segments to come), ``ANCHORED`` (its final write), ``FAILED`` (a
  failure was recorded meanwhile) or ``CLOSED`` (a close waited for it).
* ``ANCHORED``: the anchor is in the slots; later streams are still arriving.
* ``LANDED``: every stream has arrived; the consumer takes the rest of the KV.
* ``COMPLETE``: all of the KV is in the slots.
* ``CLOSING``: released; nothing new enters the slots, and the release waits
  for the threads still inside them (a write, an upgrade: `Room.inside`).
* ``FAILED`` (terminal, with `Room.failure`) and ``CLOSED`` (released, its
  slots free): nothing is written any more.

Any live state but ``WRITING`` may fail at once; a write in progress is failed
when it ends. A release moves any live state to ``CLOSING`` and, once nobody
is inside the slots, to ``CLOSED``. `TRANSITIONS` is the whole table; `advance`
is the one place it is applied (`lynx.transfer.rooms.RoomTable` calls it,
under its lock, for every change of state).

Ownership is a second, one-way change: a room is the transfer's
(`Owner.TRANSFER`) until its consumer takes it over (`Owner.CONSUMER`).
"""

from __future__ import annotations

import enum
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, NamedTuple

import numpy as np
from lynx.lifecycle import RefusedTransition, move

if TYPE_CHECKING:  # annotations only: the room record imports neither torch nor the codec
    from lynx.kvwire import KVShape
    from lynx.manifest import Manifest
    from lynx.transfer.segments import SegmentedAssembly


class RoomState(enum.Enum):
    RESERVED = "reserved"
    RECEIVING = "receiving"
    WRITING = "writing"
    ANCHORED = "anchored"
    LANDED = "landed"
    COMPLETE = "complete"
    CLOSING = "closing"
    FAILED = "failed"
    CLOSED = "closed"

    @property
    def live(self) -> bool:
        """Not yet ended (neither failed nor closed)."""
        return self in LIVE

    @property
    def anchor_in(self) -> bool:
        """The anchor is in the slots (and the room did not fail)."""
        return self in ANCHOR_IN

    @property
    def upgradable(self) -> bool:
        """Past the manifest and not ended: a landed residual may be applied to the slots."""
        return self in UPGRADABLE


LIVE = frozenset(set(RoomState) - {RoomState.CLOSING, RoomState.FAILED, RoomState.CLOSED})
ANCHOR_IN = frozenset({RoomState.ANCHORED, RoomState.LANDED, RoomState.COMPLETE})
UPGRADABLE = frozenset({RoomState.RECEIVING, RoomState.ANCHORED, RoomState.LANDED})

TRANSITIONS: Mapping[RoomState, frozenset[RoomState]] = MappingProxyType({
    RoomState.RESERVED: frozenset({RoomState.RECEIVING, RoomState.FAILED, RoomState.CLOSING}),
    RoomState.RECEIVING: frozenset({RoomState.WRITING, RoomState.FAILED, RoomState.CLOSING}),
    RoomState.WRITING: frozenset({RoomState.RECEIVING, RoomState.ANCHORED, RoomState.FAILED, RoomState.CLOSING}),
    RoomState.ANCHORED: frozenset({RoomState.LANDED, RoomState.COMPLETE, RoomState.FAILED, RoomState.CLOSING}),
    RoomState.LANDED: frozenset({RoomState.COMPLETE, RoomState.FAILED, RoomState.CLOSING}),
    RoomState.COMPLETE: frozenset({RoomState.FAILED, RoomState.CLOSING}),
    RoomState.CLOSING: frozenset({RoomState.CLOSED}),
    RoomState.FAILED: frozenset(),
    RoomState.CLOSED: frozenset(),
})  # fmt: skip
"""The states each state may move to; every other move is refused."""


def advance(current: RoomState, to: RoomState) -> RoomState:
    """`to`, if `TRANSITIONS` allows the move from `current`.

    Raises:
        RefusedTransition: the table does not allow it.
    """
    return move(TRANSITIONS, current, to, "a receiving room")


class Owner(enum.Enum):
    """Who releases the room: the transfer (its receiver), or the consumer once it took the room over."""

    TRANSFER = "transfer"
    CONSUMER = "consumer"


class Placement(NamedTuple):
    """Where an accepted manifest's KV goes in this rank's pool.

    Attributes:
        head_offset: the first of this rank's KV heads the room's heads are written into.
        heads: how many KV heads the room carries.
        segments: the shape of each segment of the room's tokens, in order.
    """

    head_offset: int
    heads: int
    segments: tuple[KVShape, ...]


@dataclass
class Room:
    """One reserved transfer; its state and everything after the reservation is the table's to set.

    Attributes:
        room: the transfer id (a part's wire id, `lynx.heads.transfer_room`).
        slots: destination KV slots, in token order; their count is exactly
            the number of tokens the sender must announce.
        aux_index: the request's metadata row.
        key: MAC key of this transfer (``lynx.transfer.keys.transfer_key``).
        since: clock time the request arrived (timings are measured from it).
        peer: who sends (e.g. the prefill's bootstrap address), for failing
            every room of a lost peer.
        nonce: the transfer nonce the sender is told (``key`` is derived from it).
        endpoints: the senders' control endpoints, to ask them to stop.
        request, part: the request the room belongs to and its part number
            (`lynx.transfer.parts.PartedRooms.reserve` sets them; a room
            reserved alone is part 0 of its own request).
        state, failure: see the module docstring.
        deadline: clock time at which the room fails for lack of progress;
            None while no deadline is armed.
        cap: clock time by which the whole transfer must have landed (set
            with the manifest); None without one.
        alive_counter: the counter of the last alive message accepted for
            the room; -1 before the first.
        manifest: the accepted manifest.
        placement: where the manifest's KV goes (set with the manifest).
        assembly: the streams being received: set with the manifest, kept
            until the room is closed (or complete), whatever fails meanwhile.
        timings: seconds from ``since`` to ``manifest_s``, ``anchor_ready_s``,
            ``residual_ready_s``; and ``transferred_tokens``.
        owner: see `Owner`.
        inside: how many threads are inside the room's slots (a writer, an
            upgrader; `RoomTable.writing`, `RoomTable.upgrading`): a release
            waits until none is.
        upgrade_turn: the upgraders' lock: the room's two upgraders (the
            receiver's data thread, the consumer) take turns.
    """

    room: int
    slots: np.ndarray
    aux_index: int
    key: bytes
    since: float
    peer: str = ""
    nonce: bytes = b""
    endpoints: tuple[str, ...] = ()
    request: int = field(default=-1, init=False)
    part: int = field(default=0, init=False)
    state: RoomState = field(default=RoomState.RESERVED, init=False)
    failure: str | None = field(default=None, init=False)
    deadline: float | None = field(default=None, init=False)
    cap: float | None = field(default=None, init=False)
    alive_counter: int = field(default=-1, init=False)
    manifest: Manifest | None = field(default=None, init=False)
    placement: Placement | None = field(default=None, init=False)
    assembly: SegmentedAssembly | None = field(default=None, init=False)
    timings: dict[str, float] = field(default_factory=dict, init=False)
    owner: Owner = field(default=Owner.TRANSFER, init=False)
    inside: int = field(default=0, init=False)
    upgrade_turn: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.request = self.room

    @property
    def num_tokens(self) -> int:
        return len(self.slots)

    def next_deadline(self, now: float, timeout: float) -> float:
        """When the room fails if nothing of it is accepted after `now`: `timeout` later, never past its cap."""
        deadline = now + timeout
        return deadline if self.cap is None else min(deadline, self.cap)

    def expiry(self, now: float, timeout: float) -> str:
        """Why the room fails at `now`, its deadline having passed: its cap, or `timeout` without progress."""
        if self.cap is not None and now > self.cap:
            allowed = self.cap - self.since - self.timings["manifest_s"]
            return (
                f"KV of the request did not all arrive within {allowed:.0f}s of its announcement, the most "
                "its frames may take at one --lynx-transfer-timeout each; is the prefill server sending it?"
            )
        return (
            f"KV of the request made no progress for {timeout:g}s "
            "(--lynx-transfer-timeout); is the prefill server alive and the link up?"
        )
