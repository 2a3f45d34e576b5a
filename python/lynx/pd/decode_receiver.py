"""The decode rank's data thread: the messages of its listener, and residual upgrades between them.

A message names its room before it is authenticated (`message_room`); what
fails its check for lack of the room's key (a bad MAC, an unknown or ended
room, a replay) is dropped and counted, never held against the room, for
anyone may have sent it. What the room's sender signed yet does not fit fails
the request. Per room:

* its one manifest, checked (`lynx.pd.decode_manifest`) and set with the
  room's move to ``RECEIVING``; a later one changes nothing;
* alive messages, each with a counter above the last, push the room's
  deadline back while the prefill computes;
* frames, placed into the room's assembly; each anchor written as soon as it
  is whole, and once every part's anchor is in, the request is reported
  anchored (`lynx.pd.decode_slots`).

When no message waits, the thread upgrades the next layer of a landed
residual (`gap`), so a message never waits for more than one layer's work.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Protocol

from lynx.config import LynxConfig
from lynx.manifest import ManifestAuthError, ManifestError, manifest_room, open_manifest
from lynx.transfer.alive import alive_room, open_alive
from lynx.transfer.frames import FrameError, decode_frame, peek_room
from lynx.transfer.parts import PartedRooms
from lynx.transfer.room_lifecycle import RoomState
from lynx.transfer.transport import Listener

from lynx.pd.decode_manifest import RefusedManifest, accept_manifest, coverage
from lynx.pd.decode_slots import SlotWriter
from lynx.pd.pool import PoolView

logger = logging.getLogger(__name__)

RECV_POLL_S = 0.5


class Reports(Protocol):
    """What the data thread reports of a request (the engine's side of it)."""

    def succeed(self, room: int) -> None: ...

    def transferring(self, room: int) -> None: ...


class DecodeReceiver:
    """The data thread's work for one decode rank.

    Args:
        listener: where the prefill ranks' messages arrive.
        requests: the rank's requests over its room table.
        slots: writes the rooms' KV into the pool.
        pool: returns the rank's pool view (waiting until there is one).
        config: this server's Lynx options.
        reports: told when a request's manifest is accepted and when its anchor is in.
        fail: fails a request (a request or one of its parts names it) with a reason.
        landed: set when a consumer waiting for KV should look again.
    """

    def __init__(
        self,
        listener: Listener,
        requests: PartedRooms,
        slots: SlotWriter,
        pool: Callable[[], PoolView],
        config: LynxConfig,
        reports: Reports,
        fail: Callable[[int, str], None],
        landed: threading.Event,
    ) -> None:
        self._listener, self._requests, self._rooms, self._slots = listener, requests, requests.table, slots
        self._pool, self._config, self._reports, self._fail, self._landed = pool, config, reports, fail, landed
        self._wires, self._wire = config.wires, config.wire  # a manifest's format, by its mode; this server's
        self.dropped = 0
        self.handling: int | None = None  # the room the thread's message or upgrade names, while it handles it

    def run(self, stop: threading.Event) -> None:
        """Messages first; landed residuals are applied in the gaps between them."""
        while not stop.is_set():
            msg = self._listener.recv(timeout_s=0 if self._slots.waiting else RECV_POLL_S)
            if msg:
                self.handling = message_room(msg)
                self.on_message(msg)
                self.handling = None
            else:
                self.gap()

    def gap(self) -> bool:
        """Upgrade the next layers of the first room with a residual waiting; False if none waits."""
        waiting = self._slots.waiting
        if not waiting:
            return False
        self.handling = waiting[0]
        applied = self._slots.step(waiting[0])
        self.handling = None
        if applied:
            self._landed.set()  # a scheduler waiting for this residual looks again
        return True

    def on_message(self, msg: list[bytes]) -> None:
        room = manifest_room(msg)
        if room is not None:
            return self._on_manifest(room, msg)
        room = alive_room(msg)
        if room is not None:
            return self._on_alive(room, msg)
        self._on_frame(msg)

    def _drop(self, room: int | None, why: str) -> None:
        self.dropped += 1
        logger.warning("Lynx decode: dropped a message for room %s: %s", room, why)

    def _on_alive(self, room: int, msg: list[bytes]) -> None:
        """The prefill is still computing the room's tokens: silence meanwhile is not a stall. Only
        a counter above every one seen for the room counts (a replayed message does not)."""
        entry = self._rooms.get(room)
        counter = None if entry is None else open_alive(msg, entry.key)
        if counter is None:
            return self._drop(room, "an alive message for no room of this rank, or with a bad MAC")
        if not self._rooms.progress(room, alive=counter):
            why = f"an alive message for an ended room, or replayed (counter {counter} not above the last)"
            return self._drop(room, why)

    def _on_manifest(self, room: int, msg: list[bytes]) -> None:
        """Accept the room's one manifest: what it says is checked, then set with the transition
        to RECEIVING, never for a room past RESERVED (a later manifest changes nothing)."""
        entry = self._rooms.get(room)
        if entry is None or entry.state is not RoomState.RESERVED:
            return self._drop(room, "a manifest for no reserved room of this rank (replayed, late or unknown)")
        try:
            manifest = open_manifest(msg, entry.key)
        except ManifestAuthError as exc:
            return self._drop(room, str(exc))
        except ManifestError as exc:
            return self._fail(room, f"rejected manifest: {exc}")
        wire = self._wires.get(manifest.mode, self._wire)
        try:
            accepted = accept_manifest(entry, manifest, self._pool(), wire, self._config)
        except RefusedManifest as exc:
            return self._fail(room, str(exc))
        problem = self._requests.start_receiving(
            room, manifest, accepted.assembly, cap_s=accepted.cap_s, placement=accepted.placement
        )
        if problem is not None:
            return self._drop(room, problem)
        manifests = [None if part is None else part.manifest for part in self._requests.entries(entry.request)]
        problem = coverage(self._pool().shard, manifests)
        if problem is not None:
            return self._fail(room, problem)
        self._reports.transferring(entry.request)

    def _on_frame(self, msg: list[bytes]) -> None:
        room = peek_room(msg)
        entry = self._rooms.get(room) if room is not None else None
        assembly = entry.assembly if entry is not None else None
        if assembly is None or entry.state not in (RoomState.RECEIVING, RoomState.ANCHORED):
            return self._drop(room, "not receiving (unknown, ended or not announced)")
        try:
            header, payload = decode_frame(msg, entry.key, max_payload=self._config.chunk_bytes)
        except FrameError as exc:  # not authenticated: anyone may have sent it
            return self._drop(room, str(exc))
        try:
            assembly.accept(header, payload)
        except FrameError as exc:  # signed by the room's sender, yet it does not fit
            return self._fail(room, f"rejected frame: {exc}")
        self._rooms.progress(room)
        if entry.state is RoomState.RECEIVING and self._slots.land_anchors(entry, assembly):
            self._requests.if_anchored(entry.request, self._reports.succeed)
        self._slots.want(entry, assembly)
        if self._rooms.anchored(entry.room) and assembly.all_ready:
            self._rooms.all_landed(entry.room, complete=assembly.num_streams == 1)
            self._landed.set()


def message_room(msg: list[bytes]) -> int | None:
    """The room a manifest, alive message or frame names (unauthenticated), or None."""
    for room_of in (manifest_room, alive_room, peek_room):
        room = room_of(msg)
        if room is not None:
            return room
    return None
