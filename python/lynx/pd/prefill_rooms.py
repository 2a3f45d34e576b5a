"""The prefill side's rooms: destinations, claims, aborts, segments computed, encodes running, rooms announced.

Every table lives under one lock, taken by the control, scheduler, encoder and
alive threads alike. Nothing here encodes or sends.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from lynx.pd.control import RoomMetadata
from lynx.pd.pool import page_slots

STALE_METADATA_S = 300.0


class Segment(NamedTuple):
    """A segment of a room's tokens whose KV is all computed: ready to encode."""

    index: int
    first_token: int
    slots: np.ndarray  # pool slots of its tokens
    total: int  # tokens of the whole room


@dataclass
class _Outgoing:
    """A room whose KV leaves segment by segment as the prefill computes it (scheduler thread)."""

    total: int  # tokens the decode ranks reserved, exactly what must be sent
    layout: list[tuple[int, int]]  # (first_token, num_tokens) of each segment
    slots: list[np.ndarray] = field(default_factory=list)  # pool slots of the tokens computed so far
    computed: int = 0
    queued: int = 0  # segments handed to the encoder
    streamed: np.ndarray | None = None  # slots of the tokens through the last segment handed over while computed

    def take_segments(self, slots: np.ndarray) -> list[Segment]:
        """The segments not handed over yet that `slots` (those of the first ``len(slots)``
        tokens) complete, now handed over."""
        segments = []
        while self.queued < len(self.layout) and sum(self.layout[self.queued]) <= len(slots):
            first, tokens = self.layout[self.queued]
            segments.append(Segment(self.queued, first, slots[first : first + tokens], self.total))
            self.queued += 1
        return segments


class PrefillRooms:
    """Per-room state of one prefill rank.

    Args:
        layout: ``(first_token, num_tokens)`` of each segment of a transfer of that many tokens.
        clock: seconds, monotonic; ages the metadata of unclaimed rooms.
    """

    def __init__(self, layout: Callable[[int], list[tuple[int, int]]], clock: Callable[[], float] = time.monotonic):
        self._layout, self._clock = layout, clock
        self._lock = threading.RLock()
        self._destinations: dict[int, dict[str, RoomMetadata]] = {}
        self._metadata_at: dict[int, float] = {}
        self._outgoing: dict[int, _Outgoing] = {}
        self._claims: set[int] = set()
        self._encoding: set[int] = set()
        self._aborted: set[int] = set()
        self._alive: dict[int, list[tuple[str, bytes, int]]] = {}  # announced, computing -> (endpoint, key, wire)
        self._wires: dict[int, int] = {}  # wire id of an announced part -> its room
        self._parts: dict[int, set[int]] = {}  # room -> the wire ids of its announced parts

    def claimed_count(self) -> int:
        with self._lock:
            return len(self._claims)

    def state_counts(self) -> dict[str, int]:
        """Rooms being encoded, claimed by a sender, aborted while claimed, and with decode metadata held."""
        with self._lock:
            return {
                "encoding": len(self._encoding),
                "claimed": len(self._claims),
                "aborted": len(self._aborted),
                "metadata": len(self._destinations),
            }

    def add_metadata(self, meta: RoomMetadata) -> int | None:
        """Record one decode rank's metadata; once every rank's is in, the decode prefix length, else None."""
        with self._lock:
            infos = self._destinations.setdefault(meta.room, {})
            infos[meta.session_id] = meta
            self._metadata_at.setdefault(meta.room, self._clock())
            complete = len(infos) == meta.required_dst_info_num
            real = [i for i in infos.values() if not i.is_dummy]
        if not complete:
            return None
        return real[0].decode_prefix_len if real else 0

    def targets(self, room: int) -> tuple[tuple[str, int], ...]:
        """The control addresses of the decode ranks a room's KV goes to."""
        with self._lock:
            infos = self._destinations.get(room, {}).values()
            return tuple(dict.fromkeys((m.endpoint, m.dst_port) for m in infos if not m.is_dummy))

    def purge(self) -> int:
        """Forget the metadata of rooms unclaimed for `STALE_METADATA_S`; return how many."""
        now = self._clock()
        with self._lock:
            stale = [r for r, t in self._metadata_at.items() if r not in self._claims and now - t > STALE_METADATA_S]
            for room in stale:
                self._destinations.pop(room, None)
                self._metadata_at.pop(room, None)
        return len(stale)

    def claim(self, room: int) -> bool:
        """Claim `room` for a new sender; False if a live sender holds it (a duplicate)."""
        with self._lock:
            if room in self._claims:
                return False
            self._claims.add(room)
            self._aborted.discard(room)
            return True

    def release(self, room: int) -> None:
        """Forget everything of the room."""
        with self._lock:
            self._claims.discard(room)
            self._outgoing.pop(room, None)
            self._alive.pop(room, None)
            for wire in self._parts.pop(room, ()):
                self._wires.pop(wire, None)
            self._destinations.pop(room, None)
            self._metadata_at.pop(room, None)
            self._aborted.discard(room)

    def abort(self, room: int) -> None:
        """Mark the room aborted: no more of it is planned, encoded or announced alive.

        Only a claimed room is remembered aborted (until its sender releases it):
        a claim starts afresh anyway, so remembering others would only grow.
        """
        with self._lock:
            if room in self._claims:
                self._aborted.add(room)
            self._alive.pop(room, None)
            self._outgoing.pop(room, None)

    def add_chunk(
        self, room: int, pages: np.ndarray, page_size: int, count: int, is_last: bool
    ) -> tuple[list[Segment], str | None] | None:
        """Account one prefilled chunk of ``count`` tokens in ``pages``.

        Returns None when the room has no real destination or was aborted, else
        ``(segments, problem)``: the segments the chunk completes, and why the
        room must fail when the prefill's token count differs from the one the
        decode ranks reserved.
        """
        segments, problem = [], None
        with self._lock:
            out = self._outgoing_of(room)
            if out is None:
                return None
            out.slots.append(page_slots(pages, page_size, count))
            out.computed += count
            if out.computed > out.total or (is_last and out.computed != out.total):
                problem = f"the decode ranks reserved {out.total} tokens, this prefill has {out.computed} to send"
            elif out.streamed is not None:
                problem = _streamed_mismatch(out)
            if problem is None:
                segments = out.take_segments(np.concatenate(out.slots))
            if is_last or problem is not None:
                self._outgoing.pop(room, None)
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
            out = self._outgoing_of(room)
            if out is None or not out.computed < len(slots) <= out.total:
                return []
            slots = np.asarray(slots, dtype=np.int64)
            segments = out.take_segments(slots)
            if segments:
                out.streamed = slots[: sum(out.layout[out.queued - 1])]
            return segments

    def busy(self, room: int) -> bool:
        """Whether the encoder is reading the room's KV pages right now (they must not be freed)."""
        with self._lock:
            return room in self._encoding

    def start_encoding(self, room: int, failed: Callable[[int], bool]) -> list[RoomMetadata]:
        """Mark the room busy and return its real destinations; [] (not busy) if aborted, ``failed`` or without one."""
        with self._lock:
            dests = self._real_destinations(room)
            if room in self._aborted or failed(room) or not dests:
                return []
            self._encoding.add(room)
            return dests

    def end_encoding(self, room: int) -> bool:
        """The encoder is done reading the room's pages; return whether it was aborted meanwhile."""
        with self._lock:
            self._encoding.discard(room)
            return room in self._aborted

    def not_aborted(self, rooms: Iterable[int]) -> set[int]:
        """Those of ``rooms`` not aborted."""
        with self._lock:
            return {room for room in rooms if room not in self._aborted}

    def announce(self, room: int, endpoint: str, key: bytes, wire: int) -> None:
        """The manifest of the room's part `wire` went to ``endpoint``: it hears the part is alive until `quiet`."""
        with self._lock:
            self._alive.setdefault(room, []).append((endpoint, key, wire))
            self._wires[wire] = room
            self._parts.setdefault(room, set()).add(wire)

    def room_of(self, wire: int) -> int:
        """The room whose part has wire id `wire` (`wire` itself if none was announced)."""
        with self._lock:
            return self._wires.get(wire, wire)

    def wires(self, room: int) -> set[int]:
        """The wire ids of the room's announced parts, and the room itself."""
        with self._lock:
            return {room, *self._parts.get(room, ())}

    def quiet(self, room: int) -> None:
        """No more alive messages for the room."""
        with self._lock:
            self._alive.pop(room, None)

    def announced(self) -> list[tuple[int, list[tuple[str, bytes, int]]]]:
        """Each announced room still computing, with the ``(endpoint, key, wire id)`` of its decode ranks."""
        with self._lock:
            return [(room, list(peers)) for room, peers in self._alive.items()]

    def _outgoing_of(self, room: int) -> _Outgoing | None:
        """The room's outgoing state, made on first use; None when it has no real destination or
        was aborted. Caller holds the lock."""
        dests = self._real_destinations(room)
        if not dests or room in self._aborted:
            return None
        out = self._outgoing.get(room)
        if out is None:
            total = dests[0].num_tokens
            out = self._outgoing[room] = _Outgoing(total, self._layout(total))
        return out

    def _real_destinations(self, room: int) -> list[RoomMetadata]:
        """The metadata of the real (not dummy) decode ranks the room's KV goes to; caller holds the lock."""
        return [m for m in self._destinations.get(room, {}).values() if not m.is_dummy]


def _streamed_mismatch(out: _Outgoing) -> str | None:
    """Why the chunks' slots differ from those segments were streamed from while computed, or None;
    forgets the streamed slots once the chunks cover them."""
    covered = min(out.computed, len(out.streamed))
    if not np.array_equal(np.concatenate(out.slots)[:covered], out.streamed[:covered]):
        return "the prefilled chunks' KV slots differ from those its segments were sent from while computed"
    if covered == len(out.streamed):
        out.streamed = None
    return None
