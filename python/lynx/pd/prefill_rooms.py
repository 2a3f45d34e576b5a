"""The rooms of a prefill rank: one `PrefillRoom` record per request it sends, kept by `PrefillRooms`.

A room's destinations, its tokens as they are computed, and its announced parts
live in its record; its state is a `PrefillRoomState` (`lynx.pd.prefill_lifecycle`),
changed only in `PrefillRooms`, under its one lock (taken by the control,
scheduler, encoder and alive threads alike), through `advance`. Nothing here
encodes or sends.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from lynx.pd.control import RoomMetadata
from lynx.pd.outgoing import Outgoing, Segment
from lynx.pd.prefill_lifecycle import PrefillEvent, PrefillRoomState, advance, allows
from lynx.pd.pool import page_slots

STALE_METADATA_S = 300.0


class AnnouncedPart(NamedTuple):
    """A part of a room whose manifest went to one decode rank: where its alive messages go."""

    endpoint: str
    key: bytes
    wire: int  # the part's wire id
    nbytes: int = 0  # what its manifest announced: every stream over all segments, and the metadata


@dataclass
class PrefillRoom:
    """One request a prefill rank sends.

    Attributes:
        room: the request's transfer id.
        state: see `lynx.pd.prefill_lifecycle`; changed only by `PrefillRooms`.
        destinations: each decode rank's metadata, by its session id.
        metadata_at: clock time the first of them arrived (None before; ages an unclaimed room).
        outgoing: its tokens as the prefill computes them; None before the first chunk, after
            the last, and once aborted.
        parts: its announced parts, until its sender releases it.
    """

    room: int
    state: PrefillRoomState = PrefillRoomState.UNCLAIMED
    destinations: dict[str, RoomMetadata] = field(default_factory=dict)
    metadata_at: float | None = None
    outgoing: Outgoing | None = None
    parts: list[AnnouncedPart] = field(default_factory=list)

    def real_destinations(self) -> list[RoomMetadata]:
        """The metadata of the real (not dummy) decode ranks its KV goes to."""
        return [m for m in self.destinations.values() if not m.is_dummy]


class PrefillRooms:
    """The rooms of one prefill rank.

    Args:
        layout: ``(first_token, num_tokens)`` of each segment of a transfer of that many tokens.
        clock: seconds, monotonic; ages the metadata of unclaimed rooms.
    """

    def __init__(self, layout: Callable[[int], list[tuple[int, int]]], clock: Callable[[], float] = time.monotonic):
        self._layout, self._clock = layout, clock
        self._lock = threading.RLock()
        self._rooms: dict[int, PrefillRoom] = {}

    # --- reading ---------------------------------------------------------------------------

    def state(self, room: int) -> PrefillRoomState | None:
        with self._lock:
            entry = self._rooms.get(room)
            return None if entry is None else entry.state

    def claimed_count(self) -> int:
        with self._lock:
            return sum(entry.state.claimed for entry in self._rooms.values())

    def state_counts(self) -> dict[str, int]:
        """Rooms being encoded, claimed by a sender, aborted while claimed, and with decode metadata held."""
        with self._lock:
            states = [entry.state for entry in self._rooms.values()]
            return {
                "encoding": sum(state.encoding for state in states),
                "claimed": sum(state.claimed for state in states),
                "aborted": sum(state.aborted for state in states),
                "metadata": sum(bool(entry.destinations) for entry in self._rooms.values()),
            }

    def targets(self, room: int) -> tuple[tuple[str, int], ...]:
        """The control addresses of the decode ranks a room's KV goes to."""
        with self._lock:
            entry = self._rooms.get(room)
            infos = entry.real_destinations() if entry is not None else []
            return tuple(dict.fromkeys((m.endpoint, m.dst_port) for m in infos))

    def busy(self, room: int) -> bool:
        """Whether the encoder is reading the room's KV pages right now (they must not be freed)."""
        with self._lock:
            entry = self._rooms.get(room)
            return entry is not None and entry.state.encoding

    def not_aborted(self, rooms: Iterable[int]) -> set[int]:
        """Those of ``rooms`` not aborted."""
        with self._lock:
            return {room for room in rooms if room not in self._rooms or not self._rooms[room].state.aborted}

    def room_of(self, wire: int) -> int:
        """The room whose part has wire id `wire` (`wire` itself if none was announced)."""
        with self._lock:
            for entry in self._rooms.values():
                if any(part.wire == wire for part in entry.parts):
                    return entry.room
            return wire

    def wires(self, room: int) -> set[int]:
        """The wire ids of the room's announced parts, and the room itself."""
        with self._lock:
            entry = self._rooms.get(room)
            return {room, *(part.wire for part in (entry.parts if entry is not None else ()))}

    def wire_bytes(self, room: int) -> int | None:
        """The bytes this rank sends for `room` over every part it announced; None before the first."""
        with self._lock:
            entry = self._rooms.get(room)
            return sum(part.nbytes for part in entry.parts) if entry is not None and entry.parts else None

    def announced(self) -> list[tuple[int, list[AnnouncedPart]]]:
        """Each announced room still computing, with the ``(endpoint, key, wire id)`` of its decode ranks."""
        with self._lock:
            return [(entry.room, list(entry.parts)) for entry in self._rooms.values() if entry.state.alive]

    # --- the control thread ----------------------------------------------------------------

    def add_metadata(self, meta: RoomMetadata) -> int | None:
        """Record one decode rank's metadata; once every rank's is in, the decode prefix length, else None."""
        with self._lock:
            entry = self._rooms.setdefault(meta.room, PrefillRoom(meta.room))
            entry.destinations[meta.session_id] = meta
            if entry.metadata_at is None:
                entry.metadata_at = self._clock()
            complete = len(entry.destinations) == meta.required_dst_info_num
            real = entry.real_destinations()
        if not complete:
            return None
        return real[0].decode_prefix_len if real else 0

    def purge(self) -> int:
        """Forget the rooms left UNCLAIMED for `STALE_METADATA_S` since their metadata came; return how many."""
        now = self._clock()
        with self._lock:
            stale = [
                entry.room
                for entry in self._rooms.values()
                if entry.state is PrefillRoomState.UNCLAIMED and now - entry.metadata_at > STALE_METADATA_S
            ]
            for room in stale:
                del self._rooms[room]
        return len(stale)

    def abort(self, room: int) -> None:
        """Nothing more of the room is planned, encoded or announced alive.

        Only a claimed room is remembered ABORTED (until its sender releases it):
        a claim starts afresh anyway, so remembering others would only grow.
        """
        with self._lock:
            entry = self._rooms.get(room)
            if entry is None:
                return
            entry.outgoing = None
            if allows(entry.state, PrefillEvent.ABORT):
                self._apply(entry, PrefillEvent.ABORT)

    # --- SGLang's sender and the scheduler thread ------------------------------------------

    def claim(self, room: int) -> bool:
        """Claim `room` for a new sender; False if a live sender holds it (a duplicate)."""
        with self._lock:
            entry = self._rooms.get(room)
            if entry is None:
                self._rooms[room] = PrefillRoom(room, PrefillRoomState.CLAIMED)
                return True
            if entry.state.claimed:
                return False
            self._apply(entry, PrefillEvent.CLAIM)
            return True

    def release(self, room: int) -> None:
        """The sender ended: forget everything of the room, whatever its state."""
        with self._lock:
            self._rooms.pop(room, None)

    def add_chunk(
        self, room: int, pages: np.ndarray, page_size: int, count: int, is_last: bool
    ) -> tuple[list[Segment], str | None] | None:
        """Account one prefilled chunk of ``count`` tokens in ``pages``.

        Returns None when the room has no real destination or was aborted, else
        ``(segments, problem)``: the segments the chunk completes, and why the
        room must fail when the prefill's token count differs from the one the
        decode ranks reserved.
        """
        with self._lock:
            entry = self._rooms.get(room)
            out = self._outgoing_of(entry)
            if out is None:
                return None
            segments, problem = out.add_chunk(page_slots(pages, page_size, count), is_last)
            if is_last or problem is not None:
                entry.outgoing = None
        return segments, problem

    def begin_forward(self, room: int, slots: np.ndarray) -> list[Segment]:
        """A prefill forward is about to compute the room's tokens through ``len(slots)``, whose
        pool slots from the first transfer token on are `slots` (a cached prefix included): hand
        over the segments it completes that no earlier chunk handed over, to encode as it writes
        their layers.

        [] when the forward completes no new segment, or would exceed the tokens reserved (the
        chunks then fail the room). `add_chunk` later checks that the chunks' slots are those the
        segments were read from.
        """
        with self._lock:
            out = self._outgoing_of(self._rooms.get(room))
            return [] if out is None else out.begin_forward(slots)

    # --- the encoder thread ----------------------------------------------------------------

    def start_encoding(self, room: int, failed: Callable[[int], bool]) -> list[RoomMetadata]:
        """CLAIMED or ANNOUNCED -> its ENCODING state, returning the room's real destinations;
        [] (nothing changes) if it is unclaimed, aborted, ``failed`` or without one."""
        with self._lock:
            entry = self._rooms.get(room)
            if entry is None or not entry.state.claimed or entry.state.aborted or failed(room):
                return []
            dests = entry.real_destinations()
            if dests:
                self._apply(entry, PrefillEvent.START_ENCODING)
            return dests

    def end_encoding(self, room: int) -> bool:
        """The encoder is done reading the room's pages; return whether it was aborted meanwhile."""
        with self._lock:
            entry = self._rooms.get(room)
            if entry is None:
                return False
            if entry.state.encoding:
                self._apply(entry, PrefillEvent.END_ENCODING)
            return entry.state.aborted

    def announce(self, room: int, endpoint: str, key: bytes, wire: int, nbytes: int = 0) -> None:
        """The manifest of the room's part `wire` (`nbytes` on the wire) went to ``endpoint``: it hears
        the part is alive until `quiet` (an aborted room's part is only remembered, to be cancelled)."""
        with self._lock:
            entry = self._rooms.get(room)
            if entry is None:
                return
            entry.parts.append(AnnouncedPart(endpoint, key, wire, nbytes))
            if allows(entry.state, PrefillEvent.ANNOUNCE):
                self._apply(entry, PrefillEvent.ANNOUNCE)

    def quiet(self, room: int) -> None:
        """No more alive messages for the room."""
        with self._lock:
            entry = self._rooms.get(room)
            if entry is not None and allows(entry.state, PrefillEvent.QUIET):
                self._apply(entry, PrefillEvent.QUIET)

    # --- inside the lock -------------------------------------------------------------------

    def _apply(self, entry: PrefillRoom, event: PrefillEvent) -> None:
        """The one place a room's state changes; caller holds the lock."""
        entry.state = advance(entry.state, event)

    def _outgoing_of(self, entry: PrefillRoom | None) -> Outgoing | None:
        """The room's outgoing tokens, made on first use; None when it has no real destination or
        was aborted. Caller holds the lock."""
        if entry is None or entry.state.aborted:
            return None
        dests = entry.real_destinations()
        if not dests:
            return None
        if entry.outgoing is None:
            total = dests[0].num_tokens
            entry.outgoing = Outgoing(total, self._layout(total))
        return entry.outgoing
