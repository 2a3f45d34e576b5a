"""Decode side of the lynx backend: receive streams, dequantize into the KV pool, report.

Every reserved request is a `lynx.transfer.rooms.Room` in one `RoomTable`
(state, failure and the one deadline live there). A supervised data thread
owns the listener (CurveZMQ when a secret is set, so only peers holding it get
a byte buffered). Per room it takes exactly one manifest, MAC'd with the
room's transfer key and announcing exactly the reserved token count, then
frames that `RequestAssembly` places into preallocated buffers.

When the anchor (stream 0 and the request metadata) has landed, its
dequantized values are written into the request's slots inside the table's
write fence (`RoomTable.writing`: whoever releases the room waits for the
write, and a failed or closing room is never written), then the room is
reported done and SGLang starts decoding. In one-stream modes that is the
whole KV. In ``lynx`` mode the residual keeps streaming in. The data thread
upgrades each segment whose residual has landed (and whose anchor is
written) in the gaps between messages, one layer at a time, so an upgrade
never holds up a message (a later anchor, the metadata) for more than one
layer's work. Until the request's verify pass nothing exact reads those
slots: forward passes on anchor-time KV only draft tokens, and verify
recomputes them. Once every stream has landed, the scheduler thread applies
whatever is left before it verifies (`apply_residual`, `take_landed`).
Every upgrade step holds the room's upgrade fence (`RoomTable.upgrading`).

Under tensor parallelism a decode rank holds a share of the KV heads
(`PoolView.shard`). When the prefill server runs more ranks than the decode
server, several prefill ranks hold this rank's heads: the request is then
reserved as one room per source (its *parts*, numbered by `lynx.heads`), each
with its own manifest naming the heads it carries, written into those heads
only. The request's state is that of all its parts: it is anchored when every
part is, complete when every part is, and a failure of one part fails all.
"""

from __future__ import annotations

import logging
import threading
from typing import NamedTuple, Protocol

import numpy as np
import torch
from lynx.config import LynxConfig
from lynx.heads import HeadSlice, coverage_problem, placement, transfer_room
from lynx.kvwire import WireFormat
from lynx.manifest import ManifestAuthError, ManifestError, manifest_room, open_manifest
from lynx.transfer.frames import (
    FrameError,
    alive_room,
    decode_frame,
    open_alive,
    peek_room,
)
from lynx.transfer.keys import new_nonce, transfer_key
from lynx.transfer.parts import PART, REQUEST, PartedRooms
from lynx.transfer.rooms import Room, RoomState, RoomTable
from lynx.transfer.segments import SegmentedAssembly
from lynx.transfer.select import make_listener
from lynx.transfer.supervise import Supervisor

from lynx.pd.pool import PoolView

logger = logging.getLogger(__name__)

RECV_POLL_S = 0.5
UPGRADE_LAYERS_PER_STEP = 1  # between two looks for a waiting message


class DecodeHost(Protocol):
    """What the decode side needs of the engine: report rooms, cancel senders."""

    def succeed(self, room: int) -> None: ...

    def fail(self, room: int, reason: str) -> None: ...

    def transferring(self, room: int) -> None: ...

    def cancel(self, room: int, endpoints: tuple[str, ...]) -> None: ...


class Reservation(NamedTuple):
    """What the prefill must be told of a reserved room: exactly this many tokens, under this nonce."""

    num_tokens: int
    nonce: bytes


class DecodeSide:
    """One per decode rank. Args: the config, the shared secret, the engine adapter, the bind address."""

    def __init__(self, config: LynxConfig, secret: bytes, host: DecodeHost, bind_host: str, clock=None) -> None:
        self.config, self.wire, self._secret, self._host = config, config.wire, secret, host
        self._wires = config.wires  # the formats a manifest may name (two under --lynx-mode auto)
        self._rooms = RoomTable(config.transfer_timeout, **({"clock": clock} if clock else {}))
        self._requests = PartedRooms(self._rooms)
        self.landed = threading.Event()
        self._pool: PoolView | None = None
        self._pool_ready = threading.Event()
        self._claims: set[int] = set()
        self._claims_lock = threading.Lock()
        self.listener = make_listener(config, secret, bind_host)
        self.supervisor = Supervisor(self._on_crash)
        self.dropped = 0
        self._handling: int | None = None  # the room the data thread's message names, while it handles it
        self._upgrades: dict[int, None] = {}  # rooms (parts) with a landed residual to apply; data thread
        # How long a request can draft on its anchor here (`lynx.speculation.DraftWindow`, set by the
        # scheduler); each request's metadata tells its prefill, which sends the residual within it.
        self.draft_window_s = 0.0

    @property
    def data_endpoint(self) -> str:
        return self.listener.endpoint

    @property
    def broken(self) -> str | None:
        """Why the data thread stopped restarting, or None."""
        return self.supervisor.broken

    @property
    def pool(self) -> PoolView:
        """The rank's pool view (waits until SGLang has built the pool)."""
        self._pool_ready.wait()
        return self._pool

    def attach(self, pool: PoolView) -> None:
        self._pool = pool
        self._pool_ready.set()

    def start(self) -> None:
        self.supervisor.start("LynxDecodeData", self._data_loop)
        logger.info("Lynx decode: receiving KV on %s", self.data_endpoint)

    def close(self) -> None:
        self.supervisor.close()
        self.listener.close()

    # --- the transfer's side (SGLang's receiver, scheduler thread) ------------------------

    def claim(self, room: int) -> bool:
        """Claim `room` for a new receiver; False if a live receiver holds it (a duplicate)."""
        with self._claims_lock:
            if room in self._claims or self._rooms.state(room) not in (None, RoomState.FAILED, RoomState.CLOSED):
                return False
            self._claims.add(room)
            return True

    def reserve(
        self, room: int, slots: np.ndarray, aux_index: int, since: float, peer: str, endpoints=(), sources: int = 1
    ) -> bytes:
        """Expect `room`'s KV into `slots` (exactly that many tokens) from `sources` prefill ranks
        (one part each, `lynx.transfer.parts`); returns its transfer nonce, shared by the parts."""
        nonce = new_nonce()
        key, slots = transfer_key(self._secret, nonce), np.asarray(slots, dtype=np.int64)
        parts = [Room(transfer_room(room, part), slots, aux_index, key, since, peer) for part in range(sources)]
        for entry in parts:
            entry.extra.update(endpoints=tuple(endpoints), nonce=nonce)
        self._requests.reserve(room, parts)
        return nonce

    def reservation(self, room: int) -> Reservation | None:
        """The room's token count and transfer nonce, or None if it has no reservation."""
        entry = self._rooms.get(room)
        return None if entry is None else Reservation(entry.num_tokens, entry.extra["nonce"])

    def room_state(self, room: int) -> RoomState | None:
        """The request's state: FAILED if a part failed, else its least advanced part's; None if gone."""
        return self._requests.state(room)

    def sent_as(self, room: int) -> str | None:
        """The mode the request's KV was sent in (its manifest's), None before its manifest or once gone."""
        manifest = next((e.manifest for e in self._requests.entries(room) if e is not None and e.manifest), None)
        return None if manifest is None else manifest.mode

    def num_streams(self, room: int) -> int:
        """Streams of the request's wire format (its manifest's; this server's before one arrived)."""
        mode = self.sent_as(room)
        return (self.wire if mode is None else self._wires[mode]).num_streams

    def timings(self, room: int) -> dict[str, float]:
        """The request's milestones so far (seconds since it arrived; its last part's); {} if it is gone."""
        return self._requests.timings(room)

    def live_count(self) -> int:
        """Requests with a live transfer on this rank."""
        return self._requests.live_requests()

    def rooms_by_state(self) -> dict[str, int]:
        """Transfer rooms (parts) per state."""
        return self._rooms.count_by_state()

    def parts(self, room: int) -> tuple[int, ...]:
        """The transfer rooms of request `room` (the room itself when one prefill rank sends it all)."""
        return self._requests.parts(room)

    def check(self, room: int) -> str | None:
        """The request's failure (every part's deadline is checked first), or None."""
        return self._requests.expire(room)

    def release(self, room: int) -> None:
        """The receiver is done: drop the room unless the consumer owns it. Waits for a write."""
        with self._claims_lock:
            self._claims.discard(room)
        self._requests.close(room, owner="transfer")

    # --- the consumer's side (the speculation controller, scheduler thread) ----------------

    def hand_over(self, room: int) -> None:
        """The consumer owns the room from now on: the receiver's `release` leaves it alone."""
        self._requests.hand_over(room)

    def forget(self, room: int) -> None:
        """The request ended: drop the room; if KV is still coming, ask the prefill to stop."""
        state = self._requests.state(room)
        entries = self._requests.close(room)
        if entries and state not in (RoomState.LANDED, RoomState.COMPLETE):
            self._host.cancel(room, entries[0].extra.get("endpoints", ()))

    def apply_residual(self, room: int) -> bool:
        """Once every stream of the request has landed, apply what the data thread has not yet
        applied of its residual; True once every segment of every part is applied (the room
        is then complete), and on every call after that (another decode rank may still be
        applying its own).

        Scheduler thread, between forward passes (the next one may verify);
        call it each iteration while the room is anchored. Whatever goes wrong
        applying it fails this request (False; `check` then names why), never
        the caller.
        """
        entries = self._requests.entries(room)
        if None in entries:
            return False
        try:
            return all([self._apply_part(entry) for entry in entries])
        except Exception as exc:
            logger.exception("Lynx decode: applying the residual of room %s failed", room)
            self._fail(room, f"applying the residual KV failed ({type(exc).__name__}: {exc})")
            return False

    def _apply_part(self, entry: Room) -> bool:
        if entry.state is RoomState.COMPLETE:
            return True
        if entry.state is not RoomState.LANDED:
            return False  # the data thread applies segments as they land
        with self._rooms.upgrading(entry.room) as held:
            if held is None:
                return False
            assembly = held.assembly  # kept until the room is closed, which waits for this fence
            for k in assembly.upgradable():  # every anchor is written once the room is anchored
                self._upgrade(held, assembly, k)
            if len(assembly.residuals_applied) < assembly.num_segments:
                return False
        return self._rooms.take_landed(entry.room) is not None

    def on_prefill_failure(self, room: int, reason: str) -> None:
        """A prefill rank reports it cannot deliver the room's KV."""
        self._fail(room, reason)

    def fail_peer(self, peer: str, reason: str) -> None:
        """The sender `peer` is gone: fail every request still expecting bytes from it."""
        for wire in self._rooms.rooms_of(peer):
            if self._requests.state(self._requests.request_of(wire)) is not RoomState.COMPLETE:
                self._fail(wire, reason)

    # --- data thread ----------------------------------------------------------------------

    def _data_loop(self) -> None:
        """Messages first; landed residuals are applied in the gaps between them."""
        while not self.supervisor.stop.is_set():
            msg = self.listener.recv(timeout_s=0 if self._upgrades else RECV_POLL_S)
            if msg:
                self._handling = message_room(msg)
                self._on_message(msg)
                self._handling = None
            elif self._upgrades:
                self._upgrade_step()

    def _upgrade_step(self) -> None:
        """Apply the next layers of the first waiting residual segment."""
        room = next(iter(self._upgrades))
        self._handling = room
        with self._rooms.upgrading(room) as entry:
            assembly = None if entry is None else entry.assembly
            segments = [] if assembly is None else assembly.upgradable()
            if segments:
                self._upgrade(entry, assembly, segments[0], UPGRADE_LAYERS_PER_STEP)
                self.pool.synchronize()
                remaining = assembly.upgradable()
        self._handling = None
        if segments and segments[0] in assembly.residuals_applied:
            self.landed.set()  # a scheduler waiting for this residual looks again
        if not segments or not remaining:
            del self._upgrades[room]

    def _on_message(self, msg: list[bytes]) -> None:
        room = manifest_room(msg)
        if room is not None:
            return self._on_manifest(room, msg)
        room = alive_room(msg)
        if room is not None:
            return self._on_alive(room, msg)
        self._on_frame(msg)

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

    def _on_crash(self, name: str, error: str) -> None:
        """Fail the room whose message the data thread was handling; every live room if none is known."""
        room, self._handling = self._handling, None
        reason = f"Lynx data thread failed ({error}); the room's frames may be lost"
        known = room is not None and self._rooms.get(room) is not None
        for doomed in [room] if known else self._rooms.live():
            self._fail(doomed, reason)

    def _fail(self, room: int, reason: str) -> None:
        """Fail the request `room` (a request or one of its parts names it): every part of it."""
        request = self._requests.request_of(room)
        if not self._requests.fail(request, reason):
            return
        logger.error("Lynx decode: room %s failed: %s", request, reason)
        entry = self._rooms.get(request)
        if entry is not None and entry.owner == "transfer":
            self._host.fail(request, reason)
        else:
            self.landed.set()  # the consumer sees the failure on its next pass

    def _drop(self, room: int | None, why: str) -> None:
        self.dropped += 1
        logger.warning("Lynx decode: dropped a message for room %s: %s", room, why)

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
        pool = self.pool
        try:
            offset = placement(pool.shard, manifest.first_head, manifest.kv_heads)
        except ValueError as exc:
            return self._fail(room, f"rejected manifest: {exc}")
        wire = self._wires.get(manifest.mode, self.wire)
        problem = manifest.mismatch(wire, pool.shape(entry.num_tokens, manifest.kv_heads), self.config.preset)
        if problem is None and manifest.aux_size != pool.aux_size:
            problem = f"aux of {manifest.aux_size} bytes, this server's metadata rows are different"
        if problem is not None:
            return self._fail(room, problem)
        segments = wire.segment_shapes(manifest.shape, manifest.segment_tokens)
        assembly = SegmentedAssembly(room, manifest.segment_sizes(wire), manifest.aux_size)
        frames = manifest.frame_count(wire, self.config.chunk_bytes)
        cap_s = self.config.transfer_timeout * (frames + len(segments))  # one timeout per frame and per segment
        placed = {"heads": (offset, manifest.kv_heads), "segments": segments}
        problem = self._requests.start_receiving(room, manifest, assembly, cap_s=cap_s, extra=placed)
        if problem is not None:
            return self._drop(room, problem)
        problem = self._coverage(entry.extra[REQUEST])
        if problem is not None:
            return self._fail(room, problem)
        self._host.transferring(entry.extra[REQUEST])

    def _coverage(self, request: int) -> str | None:
        """Once every part of the request is announced: why their heads are not exactly this rank's, or None."""
        entries = self._requests.entries(request)
        if any(entry is None or entry.manifest is None for entry in entries):
            return None
        return coverage_problem(self.pool.shard, [HeadSlice(e.manifest.first_head, e.manifest.kv_heads) for e in entries])

    def _on_frame(self, msg: list[bytes]) -> None:
        room = peek_room(msg)
        entry = self._rooms.get(room) if room is not None else None
        assembly = entry.assembly if entry is not None else None
        if assembly is None or entry.state not in (RoomState.RECEIVING, RoomState.ANCHORED):
            return self._drop(room, "not receiving (unknown, ended or not announced)")
        try:
            header, payload = decode_frame(msg, entry.key, max_payload=self.config.chunk_bytes)
        except FrameError as exc:  # not authenticated: anyone may have sent it
            return self._drop(room, str(exc))
        try:
            assembly.accept(header, payload)
        except FrameError as exc:  # signed by the room's sender, yet it does not fit
            return self._fail(room, f"rejected frame: {exc}")
        self._rooms.progress(room)
        if entry.state is RoomState.RECEIVING:
            self._land_anchors(entry, assembly)
        streams = assembly.num_streams
        if streams > 1 and entry.room not in self._upgrades and assembly.upgradable():
            self._upgrades[entry.room] = None
        if self._rooms.anchored(entry.room) and assembly.all_ready:
            self._rooms.all_landed(entry.room, complete=streams == 1)
            self.landed.set()

    def _land_anchors(self, entry: Room, assembly: SegmentedAssembly) -> None:
        """Write every segment whose anchor is whole into its slots; with the last one and the
        metadata in, the part is anchored; with every part anchored, the request may start
        decoding: report Success."""
        for k in range(assembly.num_segments):
            if k not in assembly.anchors_written and assembly.anchor_ready(k):
                if not self._write(entry, assembly, k):
                    return
        if len(assembly.anchors_written) == assembly.num_segments and assembly.aux_ready:
            request = entry.extra[REQUEST]
            if self._write(entry, assembly, None):
                self._requests.if_anchored(request, self._host.succeed)

    def _write(self, entry: Room, assembly: SegmentedAssembly, segment: int | None) -> bool:
        """Inside the room's write fence: one segment's anchor into the part's heads, or (None)
        the metadata (part 0's; every part's completes its anchor). False if the room may not be
        written any more."""
        pool = self.pool
        with self._rooms.writing(entry.room, final=segment is None) as allowed:
            if allowed and segment is not None:
                self._wire(entry).write([as_tensor(assembly.buffer(segment, 0))], *self._target(entry, segment))
                assembly.anchors_written.add(segment)
            elif allowed and entry.extra[PART] == 0:
                pool.write_aux(entry.aux_index, assembly.aux_buffer())
            if allowed:
                pool.synchronize()
        return allowed

    def _upgrade(self, entry: Room, assembly: SegmentedAssembly, segment: int, layers: int | None = None) -> None:
        """Rewrite the next `layers` layers (default: all that are left) of one segment's
        anchor-only slots with the reconstruction from every stream. The caller holds the
        room's upgrade fence."""
        shape, k_buffers, v_buffers, index = self._target(entry, segment)
        first = assembly.layers_applied.get(segment, 0)
        end = len(k_buffers) if layers is None else min(first + layers, len(k_buffers))
        streams = [as_tensor(assembly.buffer(segment, s)) for s in range(assembly.num_streams)]
        self._wire(entry).upgrade(streams, shape, k_buffers, v_buffers, index, range(first, end))
        assembly.layers_applied[segment] = end
        if end == len(k_buffers):
            assembly.residuals_applied.add(segment)

    def _wire(self, entry: Room) -> WireFormat:
        """The wire format of the room's accepted manifest."""
        return self._wires[entry.manifest.mode]

    def _target(self, entry: Room, segment: int) -> tuple:
        """Where one segment goes: its shape, the part's K and V buffers, its slots' index."""
        pool = self.pool
        shape = entry.extra["segments"][segment]
        k_buffers, v_buffers = pool.head_buffers(*entry.extra["heads"])
        return shape, k_buffers, v_buffers, pool.slot_index(_segment_slots(entry, shape))


def message_room(msg: list[bytes]) -> int | None:
    """The room a manifest, alive message or frame names (unauthenticated), or None."""
    for room_of in (manifest_room, alive_room, peek_room):
        room = room_of(msg)
        if room is not None:
            return room
    return None


def _segment_slots(entry: Room, shape) -> np.ndarray:
    return entry.slots[shape.first_token : shape.first_token + shape.num_tokens]


def as_tensor(buffer) -> torch.Tensor:
    """A uint8 tensor over a received stream buffer (torch.frombuffer refuses empty ones)."""
    view = memoryview(buffer).cast("B")
    return torch.frombuffer(view, dtype=torch.uint8) if len(view) else torch.empty(0, dtype=torch.uint8)
