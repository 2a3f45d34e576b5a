"""The Mooncake listener's side of the control protocol: handshakes, senders' signed messages, grants.

`SenderSessions` answers each sender on the listener's ROUTER socket: a
``Hello`` gets a ``Challenge`` (or a ``Reset`` naming the version it does not
speak), a right ``Auth`` admits the sender to the credits, and every
``Notify``, ``Release`` and ``Want`` must carry its session's MAC and the
next sequence number. A sender that breaks the protocol is banned and told
why. Which slots go to whom is `credits`' policy; reading the arena is the
listener's.
"""

from __future__ import annotations

import logging
import os
import time
from collections import OrderedDict

import zmq

from lynx.transfer.mooncake.control import (
    CONTROL_VERSION,
    NO_SLOT,
    NONCE_BYTES,
    Auth,
    Challenge,
    ControlError,
    Grant,
    Hello,
    Message,
    Notify,
    Ping,
    Release,
    Reset,
    Session,
    Signed,
    Want,
    decode,
    encode,
    is_inline,
)
from lynx.transfer.mooncake.credits import Credits, Peer, PeerState

logger = logging.getLogger(__name__)

MAX_PENDING_HANDSHAKES = 64


class SenderSessions:
    """The senders of one listener, as its control socket sees them; used under the listener's lock.

    Args:
        socket: the listener's ROUTER control socket (non-blocking sends).
        key: the shared secret the MACs are keyed with.
        credits: the arena's slots and the senders they are granted to.
        slot_bytes: the most a notification may put in its slot.
    """

    def __init__(self, socket: zmq.Socket, key: bytes, credits: Credits, slot_bytes: int) -> None:
        self._socket, self._key, self._credits, self._slot_bytes = socket, key, credits, slot_bytes
        self._handshakes: OrderedDict[bytes, tuple[bytes, bytes]] = OrderedDict()
        self.rejected = 0  # control messages dropped (malformed, unauthenticated, out of order)

    def handle(self, parts: list[bytes]) -> Notify | None:
        """Act on one control message (``[peer_id, *body]``); return a notification to deliver (its slot,
        unless ``NO_SLOT``, now taken from the sender), else None."""
        peer_id, body = parts[0], parts[1:]
        try:
            message = decode(body)
        except ControlError as exc:
            return self._reject(peer_id, str(exc))
        if isinstance(message, Hello):
            return self._hello(peer_id, message)
        if isinstance(message, Auth):
            return self._auth(peer_id, message)
        if isinstance(message, Notify):
            return self._notify(peer_id, message)
        if isinstance(message, (Release, Want)):
            return self._demand(peer_id, message)
        if isinstance(message, Reset):
            self._credits.end(peer_id, PeerState.GONE, time.monotonic())
            return None
        return self._reject(peer_id, f"a sender may not send {type(message).__name__}")

    def probe(self) -> None:
        """Ping every active sender: ZeroMQ refuses to route to one whose connection closed (it is then GONE)."""
        for peer_id in self._credits.active():
            self._send(peer_id, Ping())

    def grant(self) -> None:
        """Send every free slot the credit policy hands out, one signed grant per sender."""
        for peer_id, slots in self._credits.distribute().items():
            peer = self._credits.peer(peer_id)
            grant = peer.session.sign(Grant(peer.next_grant, tuple(slots)))
            peer.next_grant += 1
            self._send(peer_id, grant)

    def _hello(self, peer_id: bytes, hello: Hello) -> None:
        if self._credits.peer(peer_id) is not None:
            return self._reject(peer_id, "hello inside an established session")
        if hello.version != CONTROL_VERSION:
            self._send(peer_id, Reset(f"the sender speaks Mooncake control v{hello.version}, this listener "
                                      f"v{CONTROL_VERSION}: run the same Lynx version on both"))
            return self._reject(peer_id, f"hello of control v{hello.version}")
        nonce = os.urandom(NONCE_BYTES)
        self._handshakes.pop(peer_id, None)
        self._handshakes[peer_id] = (hello.nonce, nonce)
        while len(self._handshakes) > MAX_PENDING_HANDSHAKES:
            self._handshakes.popitem(last=False)
        self._send(peer_id, Challenge(nonce, Session(self._key, hello.nonce, nonce).challenge_tag()))
        return None

    def _auth(self, peer_id: bytes, auth: Auth) -> None:
        nonces = self._handshakes.pop(peer_id, None)
        if nonces is None:
            return self._reject(peer_id, "auth without a pending challenge")
        session = Session(self._key, *nonces)
        if not session.auth_ok(auth.tag):
            self._reject(peer_id, "auth failed: the sender does not hold the shared secret")
            self._send(peer_id, Reset("authentication failed: the shared secrets differ"))
        elif not self._credits.admit(peer_id, session):
            self._send(peer_id, Reset(f"too many senders (max_peers={self._credits.max_peers})"))
        return None

    def _in_order(self, peer_id: bytes, message: Signed) -> Peer | None:
        """The sender's peer if `message` is signed in its session and next in its sequence (which
        then moves on); else None, the message rejected."""
        peer = self._credits.peer(peer_id)
        if peer is None or peer.state is PeerState.BANNED:
            self._reject(peer_id, f"{type(message).__name__} outside a session")
            self._send(peer_id, Reset("no session: handshake first"))
            return None
        if not peer.session.check(message):
            return self._reject(peer_id, f"{type(message).__name__} MAC mismatch")
        if message.seq != peer.next_seq:
            kind = type(message).__name__
            return self._reject(peer_id, f"{kind} {message.seq} out of order (expected {peer.next_seq})")
        peer.next_seq += 1
        return peer

    def _demand(self, peer_id: bytes, message: Release | Want) -> None:
        """An idle sender gives its slots back, or a sender wants slots again."""
        if self._in_order(peer_id, message) is None:
            return None
        if isinstance(message, Want):
            self._credits.want(peer_id)
        elif not self._credits.give_back(peer_id, message.slots):
            return self._reject(peer_id, f"release of slots {message.slots} not granted to the sender")
        self.grant()
        return None

    def _notify(self, peer_id: bytes, notify: Notify) -> Notify | None:
        if self._in_order(peer_id, notify) is None:
            return None
        arena_bytes = sum(length for length in notify.lengths if not is_inline(length))
        if arena_bytes > self._slot_bytes or (notify.slot != NO_SLOT and not self._credits.take(peer_id, notify.slot)):
            return self._reject(peer_id, f"notification for slot {notify.slot} not granted or over {self._slot_bytes} bytes")
        return notify

    def _reject(self, peer_id: bytes, reason: str) -> None:
        """Count and drop a bad control message; a session that sent one is banned."""
        self.rejected += 1
        logger.debug("Mooncake listener dropped a control message: %s", reason)
        self._handshakes.pop(peer_id, None)
        peer = self._credits.peer(peer_id)
        if peer is not None and peer.state is not PeerState.BANNED:
            logger.warning("Mooncake listener ends a sender's session: %s", reason)
            self._credits.end(peer_id, PeerState.BANNED, time.monotonic())
            self._send(peer_id, Reset(reason))
        return None

    def _send(self, peer_id: bytes, message: Message) -> None:
        """Send without blocking; a sender that cannot take it (gone, not reading) is ended as GONE."""
        try:
            self._socket.send_multipart([peer_id, *encode(message)], zmq.NOBLOCK)
        except zmq.ZMQError as exc:
            peer = self._credits.peer(peer_id)
            if peer is not None and peer.state is PeerState.ACTIVE:
                logger.info("Mooncake listener: a sender is gone or not reading (%s)", exc)
                self._credits.end(peer_id, PeerState.GONE, time.monotonic())
