"""Decode side of the lynx backend: receive streams, dequantize into the KV pool, report.

`DecodeSide` is what the scheduler thread calls: claims, reservations,
states, release, and the rest of a landed residual. Every reserved request is
a `lynx.transfer.room_lifecycle.Room` in one `RoomTable` (state, failure and
the one deadline live there). A supervised data thread
(`lynx.pd.decode_receiver`) reads the listener (CurveZMQ when a secret is
set, so only peers holding it get a byte buffered). Per room it takes exactly
one manifest, MAC'd with the room's transfer key and announcing exactly the
reserved token count (`lynx.pd.decode_manifest`), then frames that
`RequestAssembly` places into preallocated buffers.

When the anchor (stream 0 and the request metadata) has landed, its
dequantized values are written into the request's slots
(`lynx.pd.decode_slots`), then the room is reported done and SGLang starts
decoding. In one-stream modes that is the whole KV. In ``lynx`` mode the
residual keeps streaming in; the data thread upgrades the slots of each
segment whose residual has landed in the gaps between messages, and the
scheduler thread applies whatever is left before it verifies
(`apply_residual`). Until the request's verify pass nothing exact reads those
slots: forward passes on anchor-time KV only draft tokens, and verify
recomputes them.

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
from lynx.config import LynxConfig
from lynx.heads import transfer_room
from lynx.transfer.keys import new_nonce, transfer_key
from lynx.transfer.parts import PartedRooms
from lynx.transfer.room_lifecycle import Owner, Room, RoomState
from lynx.transfer.rooms import RoomTable
from lynx.transfer.select import make_listener
from lynx.transfer.supervise import Supervisor

from lynx.pd.decode_receiver import DecodeReceiver
from lynx.pd.decode_slots import SlotWriter
from lynx.pd.pool import PoolView

logger = logging.getLogger(__name__)


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
        self.listener = make_listener(config, secret, bind_host)
        self.supervisor = Supervisor(self._on_crash)
        self.slots = SlotWriter(self._rooms, lambda: self.pool, self._wires)
        self.receiver = DecodeReceiver(
            self.listener, self._requests, self.slots, lambda: self.pool, config, host, self._fail, self.landed
        )
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
        self.supervisor.start("LynxDecodeData", lambda: self.receiver.run(self.supervisor.stop))
        logger.info("Lynx decode: receiving KV on %s", self.data_endpoint)

    def close(self) -> None:
        self.supervisor.close()
        self.listener.close()

    # --- the transfer's side (SGLang's receiver, scheduler thread) ------------------------

    def claim(self, room: int) -> bool:
        """Claim `room` for a new receiver; False if a live receiver holds it (a duplicate)."""
        return self._requests.claim(room)

    def reserve(
        self, room: int, slots: np.ndarray, aux_index: int, since: float, peer: str, endpoints=(), sources: int = 1
    ) -> bytes:
        """Expect `room`'s KV into `slots` (exactly that many tokens) from `sources` prefill ranks
        (one part each, `lynx.transfer.parts`); returns its transfer nonce, shared by the parts."""
        nonce = new_nonce()
        key, slots = transfer_key(self._secret, nonce), np.asarray(slots, dtype=np.int64)
        endpoints = tuple(endpoints)
        wires = [transfer_room(room, part) for part in range(sources)]
        self._requests.reserve(room, [Room(w, slots, aux_index, key, since, peer, nonce, endpoints) for w in wires])
        return nonce

    def reservation(self, room: int) -> Reservation | None:
        """The room's token count and transfer nonce, or None if it has no reservation."""
        entry = self._rooms.get(room)
        return None if entry is None else Reservation(entry.num_tokens, entry.nonce)

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
        self._requests.release(room)

    # --- the consumer's side (the speculation controller, scheduler thread) ----------------

    def hand_over(self, room: int) -> None:
        """The consumer owns the room from now on: the receiver's `release` leaves it alone."""
        self._requests.hand_over(room)

    def forget(self, room: int) -> None:
        """The request ended: drop the room; if KV is still coming, ask the prefill to stop."""
        state = self._requests.state(room)
        entries = self._requests.close(room)
        if entries and state not in (RoomState.LANDED, RoomState.COMPLETE):
            self._host.cancel(room, entries[0].endpoints)

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
            return all([self.slots.apply(entry) for entry in entries])
        except Exception as exc:
            logger.exception("Lynx decode: applying the residual of room %s failed", room)
            self._fail(room, f"applying the residual KV failed ({type(exc).__name__}: {exc})")
            return False

    def on_prefill_failure(self, room: int, reason: str) -> None:
        """A prefill rank reports it cannot deliver the room's KV."""
        self._fail(room, reason)

    def fail_peer(self, peer: str, reason: str) -> None:
        """The sender `peer` is gone: fail every request still expecting bytes from it."""
        for wire in self._rooms.rooms_of(peer):
            if self._requests.state(self._requests.request_of(wire)) is not RoomState.COMPLETE:
                self._fail(wire, reason)

    # --- the data thread (`lynx.pd.decode_receiver`) and failures ---------------------------

    @property
    def dropped(self) -> int:
        """Messages dropped unauthenticated (or replayed, or for no live room of this rank)."""
        return self.receiver.dropped

    def _on_message(self, msg: list[bytes]) -> None:
        """Handle one message as the data thread does."""
        self.receiver.on_message(msg)

    def _on_crash(self, name: str, error: str) -> None:
        """Fail the room whose message the data thread was handling; every live room if none is known."""
        room, self.receiver.handling = self.receiver.handling, None
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
        if entry is not None and entry.owner is Owner.TRANSFER:
            self._host.fail(request, reason)
        else:
            self.landed.set()  # the consumer sees the failure on its next pass
