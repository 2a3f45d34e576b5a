"""Prefill side of the lynx backend: learn destinations, encode KV, send it by priority.

The manager hands it decode registrations, per-request metadata (a transfer
nonce, the exact token count and the data endpoint of each decode rank) and
abort notices; each room is a `PrefillRoom` record in a `PrefillRooms`, its
state one `PrefillRoomState`. On each prefilled chunk the segments it
completes go to the supervised `PrefillEncoder` thread, which snapshots their
KV into the mode's streams (anchor first), announces the room with a manifest
MAC'd by the transfer's key and hands both to the `PrioritySender`, whose
single link sends every queued anchor byte before any residual byte and skips
peers that do not read. The room is reported Success once the snapshot is
taken, so SGLang may free the prefill KV pages. An abort that arrives while
the encoder reads those pages waits for it (`busy`), and the streams of an
aborted request are never sent. Until then, a supervised alive thread tells
the decode ranks of each announced room that its prefill is still computing;
the same thread forgets, now and then, the metadata of rooms no request ever
claimed here. Until a released room's queued bytes have left, the decode
ranks to tell if they fail to send are kept (`release`).
"""

from __future__ import annotations

import itertools
import logging
import time
from typing import Protocol

import numpy as np
from lynx.config import LynxConfig
from lynx.heads import heads_to_send, part_of, transfer_room
from lynx.manifest import wire_version
from lynx.transfer.alive import encode_alive
from lynx.transfer.pacer import make_pacer
from lynx.transfer.select import make_transport
from lynx.transfer.sender import PrioritySender
from lynx.transfer.supervise import Supervisor

from lynx.pd.control import (
    ControlError,
    DecodeRegistration,
    RoomMetadata,
    check_data_endpoint,
)
from lynx.pd.layers import DeviceMarks, ForwardLayers
from lynx.pd.pool import PoolView
from lynx.pd.prefill_encoder import EncoderHost, Job, PrefillEncoder, Streaming
from lynx.pd.segment_streams import Route
from lynx.pd.prefill_rooms import PrefillRooms

logger = logging.getLogger(__name__)

ALIVE_EVERY_S = 1.0
PURGE_EVERY_S = 30.0
LAYER_STREAMING_DEVICES = ("cpu", "cuda")  # where a forward's segments leave layer by layer (see `streams_layers`)


class PrefillHost(EncoderHost, Protocol):
    """What the prefill side needs of the engine."""

    def room_ready(self, room: int, decode_prefix_len: int) -> None: ...

    def fail(self, room: int, reason: str, notify: tuple[tuple[str, int], ...] = ()) -> None:
        """Fail the room here unless it already succeeded, and tell the decode ranks in `notify`."""


class PrefillSide:
    """One per prefill rank. Args: the config, the shared secret, the engine adapter, this rank's address."""

    def __init__(
        self, config: LynxConfig, secret: bytes, host: PrefillHost, address: str, clock=time.monotonic
    ) -> None:
        self.config, self.wire, self._host, self._clock = config, config.wire, host, clock
        self.peers: dict[str, DecodeRegistration] = {}
        self.routes: dict[str, Route] = {}  # per decode session: the heads it gets from this rank
        self.refused: dict[str, str] = {}
        self.segments_sent = {"while_computed": 0, "after_forward": 0}  # scheduler thread
        wire = self.wire
        # Wire ids of released rooms with bytes still queued -> (room, the decode ranks to tell if they fail).
        self._unsent: dict[int, tuple[int, tuple[tuple[str, int], ...]]] = {}
        self._rooms = PrefillRooms(lambda total: wire.segments(total, config.segment_tokens), clock)
        self.transport = make_transport(config, secret, address)
        self.sender = PrioritySender(
            self.transport,
            secret,
            chunk_bytes=config.chunk_bytes,
            pacer=make_pacer(config.link_gbps, burst_bytes=config.chunk_bytes),
            on_error=self._on_send_error,
            on_sent=self._on_stream_sent,
            submit_timeout_s=0,
            residual_window_s=config.residual_window_s,
            residual_finish=config.residual_priority == "finish",
        )
        self.supervisor = Supervisor(self._on_crash)
        self._alive_counter = itertools.count()  # one for every alive message this rank sends
        self.encoder = PrefillEncoder(
            config, wire, secret, host, self._rooms, self.sender, self.supervisor.stop,
            route=lambda meta: self.routes[meta.session_id],
        )  # fmt: skip

    @property
    def broken(self) -> str | None:
        """Why a Lynx thread of this side (the sender's worker included) stopped restarting, or None."""
        return self.supervisor.broken or self.sender.broken

    @property
    def dropped(self) -> int:
        return self.sender.stats().chunks_dropped

    def live_count(self) -> int:
        return self._rooms.claimed_count()

    def rooms_by_state(self) -> dict[str, int]:
        queued = self.sender.stats().queued_bytes
        return {**self._rooms.state_counts(), "queued_bytes": queued}

    def attach(self, pool: PoolView) -> None:
        self.encoder.attach(pool)

    @property
    def pool(self) -> PoolView:
        return self.encoder.pool

    def start(self) -> None:
        self.sender.start()
        self.supervisor.start("LynxPrefillEncoder", self.encoder.loop)
        self.supervisor.start("LynxPrefillAlive", self._alive_loop)

    def close(self) -> None:
        self.supervisor.close()
        self.sender.close()
        self.transport.close()

    # --- control (the manager's control thread) -------------------------------------------

    def on_registration(self, reg: DecodeRegistration, aux_item_lens: tuple[int, ...]) -> None:
        """A decode rank registers; a refusal is kept and named to each of its requests."""
        known = self.peers.get(reg.session_id)
        if known is not None and reg.issued_ns <= known.issued_ns:
            raise ControlError(f"ignored a stale registration of {reg.session_id} (replayed or reordered)")
        problem, route = None, None
        if reg.wire_version != wire_version():
            problem = f"decode {reg.session_id} speaks {reg.wire_version}, this prefill {wire_version()}"
        elif reg.aux_item_lens != aux_item_lens:
            problem = (
                f"decode {reg.session_id} has metadata buffers {reg.aux_item_lens}, this prefill "
                f"{aux_item_lens}; start both with the same options"
            )
        else:
            mine = self.pool.shard
            try:
                route = Route(heads_to_send(mine, reg.heads), part_of(mine, reg.heads.tp_size))
            except ValueError as exc:
                problem = f"decode {reg.session_id} (TP {reg.heads.tp_size}) cannot get its KV heads here: {exc}"
        if problem is not None:
            self.refused[reg.session_id] = problem
            self.peers.pop(reg.session_id, None)
            raise ControlError(f"refused decode {reg.session_id}: {problem}")
        self.refused.pop(reg.session_id, None)
        self.routes[reg.session_id] = route
        self.peers[reg.session_id] = reg
        logger.info("Lynx prefill: decode %s registered (heads %s)", reg.session_id, route.heads)

    def on_metadata(self, meta: RoomMetadata) -> None:
        """A decode rank's expectations of one request; all ranks in: the room may start."""
        if meta.session_id in self.refused:
            reason = f"this prefill refused the decode server: {self.refused[meta.session_id]}"
            self._host.fail(meta.room, reason, ((meta.endpoint, meta.dst_port),))
            return
        if meta.session_id not in self.peers:
            raise ControlError(f"metadata for room {meta.room} from unregistered {meta.session_id}")
        if not meta.is_dummy:
            check_data_endpoint(meta.data_endpoint, meta.endpoint)
            self.sender.set_window(transfer_room(meta.room, self.routes[meta.session_id].part), meta.draft_window_ms / 1000)
        decode_prefix_len = self._rooms.add_metadata(meta)
        if decode_prefix_len is not None:
            self._host.room_ready(meta.room, decode_prefix_len)

    def on_abort(self, room: int, reason: str) -> None:
        """A decode rank gave the request up: stop it, and fail it unless it already succeeded."""
        self.abort(room)
        self._host.fail(room, reason)

    def abort(self, room: int) -> None:
        """Nothing more of the room is encoded or sent."""
        wires = self._rooms.wires(room) | {wire for wire, (of, _) in list(self._unsent.items()) if of == room}
        self._rooms.abort(room)
        for wire in wires:
            self.sender.cancel(wire)
            self._unsent.pop(wire, None)

    def purge(self) -> None:
        """Forget metadata of rooms no request ever claimed (the prefill never saw them)."""
        stale = self._rooms.purge()
        if stale:
            logger.info("Lynx prefill: dropped metadata of %d rooms that never arrived here", stale)

    # --- SGLang's sender (scheduler thread) -------------------------------------------------

    def claim(self, room: int) -> bool:
        """Claim `room` for a new sender; False if a live sender holds it (a duplicate)."""
        return self._rooms.claim(room)

    def release(self, room: int) -> None:
        """The sender ended: forget the room. Its queued bytes stay queued unless aborted; until
        they have left, its decode ranks are kept for `_on_send_error` to tell if they fail."""
        targets, wires = self._rooms.targets(room), self._rooms.wires(room)
        self._rooms.release(room)
        for wire in wires if targets else ():
            self._unsent[wire] = (room, targets)
            if not self.sender.queued(wire):  # asked once the entry is in: `_on_stream_sent` may race
                self._unsent.pop(wire, None)

    def wire_bytes(self, room: int) -> int | None:
        """The bytes this rank sends for `room` (every stream of every announced part, and the
        metadata); None before its first manifest went out. Ask before `release`."""
        return self._rooms.wire_bytes(room)

    def busy(self, room: int) -> bool:
        """Whether the encoder is reading the room's KV pages right now (they must not be freed)."""
        return self._rooms.busy(room)

    def add_chunk(self, room: int, pages, is_last: bool, aux_index, num_tokens) -> None:
        """Called by SGLang's sender for each prefilled chunk: queue every segment it completes."""
        pages = np.asarray(pages, dtype=np.int64)
        page_size = self.pool.page_size
        count = len(pages) * page_size if num_tokens is None else int(num_tokens)
        planned = self._rooms.add_chunk(room, pages, page_size, count, is_last)
        if planned is None:
            return
        segments, problem = planned
        if problem is not None:
            self._host.fail(room, problem, self._rooms.targets(room))
            return
        jobs = [Job(room, s.index, s.first_token, s.slots, s.total) for s in segments]
        self.segments_sent["after_forward"] += len(jobs)
        if is_last:
            jobs.append(Job(room, None, aux_index=aux_index))
        self.encoder.put(jobs)

    @property
    def streams_layers(self) -> bool:
        """Whether a forward's segments may leave layer by layer while it runs: not with
        `--lynx-segment-tokens 0`; only from a pool on the CPU (whose writes are done when they
        return) or on a CUDA GPU (whose writes the encoder waits for by event)."""
        return self.config.segment_tokens != 0 and self.pool.device.type in LAYER_STREAMING_DEVICES

    def begin_forward(self, chunks: list[tuple[int, np.ndarray]]) -> ForwardLayers | None:
        """Before a prefill forward computes each ``(room, slots)`` chunk (slots from the room's
        first transfer token through the chunk's end): the segments it completes are encoded and
        sent layer by layer as it writes them. Returns the forward's `ForwardLayers` to advance,
        or None when no segment streams (none completed, or `streams_layers` is false)."""
        if not self.streams_layers:
            return None
        jobs = [
            Job(room, segment.index, segment.first_token, segment.slots, segment.total)
            for room, slots in chunks
            for segment in self._rooms.begin_forward(room, slots)
        ]
        self.segments_sent["while_computed"] += len(jobs)
        if not jobs:
            return None
        device = self.pool.device
        layers = ForwardLayers(self.pool.shape(0).num_layers, DeviceMarks(device) if device.type == "cuda" else None)
        self.encoder.put_streaming(Streaming(jobs, layers))
        return layers

    def drain(self, timeout_s: float) -> bool:
        """Wait until every queued job is encoded and its streams handed to the sender."""
        return self.encoder.drain(timeout_s)

    # --- supervised threads -----------------------------------------------------------------

    def _alive_loop(self) -> None:
        """While an announced room's prefill is still computing, tell its decode ranks so every
        `ALIVE_EVERY_S` (their no-progress timeout then only fires on a real stall), each message
        with a counter of its own (a replayed one is refused); `purge` every `PURGE_EVERY_S`."""
        last_purge = self._clock()
        while not self.supervisor.stop.wait(ALIVE_EVERY_S):
            for _, peers in self._rooms.announced():
                for part in peers:
                    alive = encode_alive(part.wire, next(self._alive_counter), part.key)
                    self.sender.submit_message(part.endpoint, part.wire, alive)
            if self._clock() - last_purge > PURGE_EVERY_S:
                self.purge()
                last_purge = self._clock()

    def _on_crash(self, name: str, error: str) -> None:
        logger.error("Lynx prefill: %s restarted after: %s", name, error)

    def _on_send_error(self, wire: int, message: str) -> None:
        room, targets = self._unsent.pop(wire, None) or (self._rooms.room_of(wire), None)
        if targets is None:
            self._rooms.quiet(room)
            targets = self._rooms.targets(room)
        logger.error("Lynx prefill: room %s: %s", room, message)
        self._host.fail(room, message, targets)

    def _on_stream_sent(self, wire: int, stream: int) -> None:
        if wire in self._unsent and not self.sender.queued(wire):
            self._unsent.pop(wire, None)
