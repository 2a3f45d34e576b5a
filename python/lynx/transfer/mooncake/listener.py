"""The receiving end of the Mooncake transport: a registered arena of slots, credits, and a control socket.

Memory is bounded by the arena (``slots * slot_bytes``, registered once with
this listener's own engine) plus ZeroMQ's bounded control queues, whatever
peers do: a sender writes only into slots granted to it, and a slot is
granted again only after ``recv`` is done with it.

What is authenticated (the threat model):

* Control plane: with a non-empty secret the control socket is CurveZMQ with
  a ZAP check, keyed like the ZeroMQ data path (``keys.curve_keys``): a peer
  without the secret cannot complete the handshake, so ZeroMQ buffers none
  of its bytes (it would otherwise buffer a multipart message of any number
  of parts whole), and every control byte is encrypted. Inside, a sender
  answers a fresh challenge (and the listener proves the secret back); every
  grant and notification carries a MAC bound to the session and its
  sequence number. So no peer without the secret can make ``recv`` return
  bytes from the arena, or hold slots.
* Data plane: Mooncake itself authenticates nothing. Anyone who can reach
  the engine's ports (open on every interface) can read or overwrite the
  registered arena, though never memory outside it. Frames therefore keep
  their own MAC (``frames.decode_frame``), which the receiver checks on the
  copy it owns: with ``copy=True`` (default) a forged or overwritten payload
  fails authentication; it cannot be forged. Confidentiality needs a trusted
  fabric (or a firewall on the engine's ports): the bytes cross in clear.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import numpy as np
import zmq

from lynx.transfer.keys import curve_keys
from lynx.transfer.mooncake.control import NO_SLOT, MooncakeEndpoint, Notify, is_inline
from lynx.transfer.mooncake.credits import Credits
from lynx.transfer.mooncake.engine import MooncakeEngine
from lynx.transfer.mooncake.sessions import SenderSessions
from lynx.transfer.transport import Listener, TransportError
from lynx.transfer.zmq_transport import ServerContext

MAX_CONTROL_PART = 1 << 16
PROBE_INTERVAL_S = 1.0


@dataclass(frozen=True)
class ListenerStats:
    """Counters of a ``MooncakeListener``.

    Attributes:
        sessions: authenticated senders connected now.
        free_slots: slots neither granted (to a sender, or to one that ended
            less than ``quarantine_s`` ago) nor held by the caller.
        messages: messages returned by ``recv``.
        rejected: control messages dropped (malformed, unauthenticated, out of order).
    """

    sessions: int
    free_slots: int
    messages: int
    rejected: int


class MooncakeListener(Listener):
    """Receives messages written by ``MooncakeTransport`` senders into this listener's arena.

    Args:
        key: shared secret of the control plane: CurveZMQ keys and MACs
            (``b""``: plaintext and unkeyed, no authentication).
        host: address the control socket binds and the engine advertises.
        port: control port (0: any free port).
        protocol, device: the engine's transport (``tcp``; ``rdma`` on clusters).
        slots, slot_bytes: the arena; a message's large parts (over
            ``mooncake.control.INLINE_MAX`` bytes each) must fit one slot.
        slots_per_peer: credits one sender holds at most (its write pipeline depth).
        copy: the ownership rule of ``recv``'s parts. True (default): every
            part is ``bytes`` the caller owns; the slot is granted again
            before ``recv`` returns. False: large parts are read-only
            memoryviews into the arena, valid until the next ``recv`` or
            ``close`` (the slot is then granted again and will be
            overwritten); anyone who can reach the engine's ports can change
            those bytes while the caller holds them, so verify-then-use is
            only sound on a trusted fabric.
        max_peers: authenticated senders at most; more are refused.
        quarantine_s: a sender that is gone (its control connection closed:
            probed every ``PROBE_INTERVAL_S`` during ``recv``, and ZeroMQ
            heartbeats close a silent one within about 5 s) or broke the
            protocol keeps the slots granted to it this long (a late write of
            it may still land in them); notifications a gone sender sent
            before it left are still delivered.

    ``recv`` does the listener's work (handshakes, credits): call it
    continuously from one thread.
    """

    def __init__(
        self,
        key: bytes,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        protocol: str = "tcp",
        device: str = "",
        slots: int = 16,
        slot_bytes: int = 4 << 20,
        slots_per_peer: int = 8,
        copy: bool = True,
        max_peers: int = 64,
        quarantine_s: float = 10.0,
    ) -> None:
        for name, value in (("slots", slots), ("slot_bytes", slot_bytes), ("slots_per_peer", slots_per_peer),
                            ("max_peers", max_peers)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        if slots >= NO_SLOT:
            raise ValueError(f"slots must be below {NO_SLOT}")
        if not quarantine_s >= 0:
            raise ValueError(f"quarantine_s must be >= 0, got {quarantine_s!r}")
        if not isinstance(key, (bytes, bytearray)):
            raise ValueError(f"key must be bytes, got {type(key).__name__}")
        self._key, self._copy, self._slot_bytes = bytes(key), copy, slot_bytes
        self._credits = Credits(slots, slots_per_peer, max_peers, quarantine_s)
        self._engine = MooncakeEngine(host, protocol, device)
        curve = curve_keys(self._key) if self._key else None
        self._server = ServerContext(curve)
        try:
            self._arena = np.zeros(slots * slot_bytes, dtype=np.uint8)
            arena_address = self._engine.register(self._arena)
            self._socket = self._control_socket(host, port, curve)
        except BaseException:
            self._server.close()
            self._engine.close()
            raise
        self._endpoint = str(MooncakeEndpoint(
            self._engine.session, protocol, self._socket.getsockopt_string(zmq.LAST_ENDPOINT), arena_address,
            slots, slot_bytes,
        ))
        self._poller = zmq.Poller()
        self._poller.register(self._socket, zmq.POLLIN)
        self._sessions = SenderSessions(self._socket, self._key, self._credits, slot_bytes)
        self._held: int | None = None
        self._messages = 0
        self._next_probe = time.monotonic() + PROBE_INTERVAL_S
        self._lock = threading.Lock()
        self._closed = False

    @property
    def endpoint(self) -> str:
        """``mooncake://host:port?...`` (see ``MooncakeEndpoint``)."""
        return self._endpoint

    def stats(self) -> ListenerStats:
        with self._lock:
            return ListenerStats(len(self._credits.active()), self._credits.free, self._messages, self._sessions.rejected)

    def recv(self, timeout_s: float) -> list[bytes | memoryview] | None:
        """The next message's parts (see ``copy`` for who owns them), or None after ``timeout_s`` seconds."""
        with self._lock:
            if self._closed:
                raise TransportError(f"listener {self._endpoint} is closed")
            if self._held is not None:
                self._credits.release(self._held)
                self._held = None
                self._sessions.grant()
            deadline = time.monotonic() + max(0.0, timeout_s)
            while True:
                now = time.monotonic()
                self._credits.expire(now)
                if now >= self._next_probe:
                    self._next_probe = now + PROBE_INTERVAL_S
                    self._sessions.probe()
                self._sessions.grant()
                wait = min(deadline, self._next_probe, self._credits.next_end() or deadline) - now
                if self._poller.poll(max(0, round(wait * 1000))):
                    notify = self._sessions.handle(self._socket.recv_multipart(zmq.NOBLOCK))
                    if notify is not None:
                        self._messages += 1
                        return self._deliver(notify)
                if time.monotonic() >= deadline:
                    return None

    def close(self) -> None:
        """Close the control socket and stop the engine; idempotent. Views from ``recv`` stay readable."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._server.close(self._socket)
            self._engine.close()

    def _control_socket(self, host: str, port: int, curve) -> zmq.Socket:
        socket = self._server.context.socket(zmq.ROUTER)
        try:
            for option, value in ((zmq.LINGER, 0), (zmq.ROUTER_MANDATORY, 1), (zmq.MAXMSGSIZE, MAX_CONTROL_PART),
                                  (zmq.RCVHWM, 256), (zmq.SNDHWM, 1024), (zmq.HEARTBEAT_IVL, 1000),
                                  (zmq.HEARTBEAT_TIMEOUT, 5000)):
                socket.setsockopt(option, value)
            if curve is not None:
                socket.curve_server = True
                socket.curve_publickey, socket.curve_secretkey = curve.server_public, curve.server_secret
            socket.bind(f"tcp://{host}:{port or '*'}")
        except zmq.ZMQError as exc:
            socket.close(linger=0)
            raise TransportError(f"cannot listen on tcp://{host}:{port}: {exc}") from exc
        return socket

    def _deliver(self, notify: Notify) -> list[bytes | memoryview]:
        """A notification's parts: inline ones from it, the others read from its slot (see ``copy``)."""
        inline, offset = iter(notify.inline), notify.slot * self._slot_bytes
        parts: list[bytes | memoryview] = []
        for length in notify.lengths:
            if is_inline(length):
                parts.append(next(inline))
            else:
                view = self._arena[offset : offset + length]
                parts.append(view.tobytes() if self._copy else memoryview(view).toreadonly())
                offset += length
        if notify.slot != NO_SLOT and self._copy:
            self._credits.release(notify.slot)
            self._sessions.grant()
        elif notify.slot != NO_SLOT:
            self._held = notify.slot
        return parts
