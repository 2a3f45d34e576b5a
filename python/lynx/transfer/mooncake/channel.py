"""One link's control connection to a Mooncake listener: the DEALER socket, the handshake, messages in and out.

Used by the link's thread only. Any fault (a deadline missed, a malformed
message, a ``Reset`` from the listener, a full socket) raises `LinkFailure`,
which ends the link.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import zmq

from lynx.transfer.keys import CurveKeys
from lynx.transfer.mooncake.control import (
    NONCE_BYTES,
    Auth,
    Challenge,
    ControlError,
    Hello,
    Message,
    Ping,
    Reset,
    Session,
    decode,
    encode,
)


class LinkFailure(Exception):
    """Ends a link; the message says why."""


class SenderChannel:
    """The DEALER socket to one listener's control endpoint, with a poller that also wakes on ``wake_fd``
    (a non-blocking pipe the link's owner writes to when it queues a message or closes)."""

    def __init__(self, context: zmq.Context, control: str, key: bytes, timeout_s: float, curve: CurveKeys | None,
                 wake_fd: int) -> None:
        self._key, self.timeout_s, self._wake_fd = key, timeout_s, wake_fd
        self.socket = context.socket(zmq.DEALER)
        for option, value in ((zmq.LINGER, 0), (zmq.IMMEDIATE, 1), (zmq.SNDHWM, 1024), (zmq.RCVHWM, 1024),
                              (zmq.SNDTIMEO, max(1, round(timeout_s * 1000))), (zmq.MAXMSGSIZE, 1 << 16)):
            self.socket.setsockopt(option, value)
        if curve is not None:
            self.socket.curve_serverkey, self.socket.curve_publickey = curve.server_public, curve.client_public
            self.socket.curve_secretkey = curve.client_secret
        self._poller = zmq.Poller()
        self._poller.register(self.socket, zmq.POLLIN)
        self._poller.register(wake_fd, zmq.POLLIN)
        self._control = control

    def handshake(self, closing: Callable[[], bool]) -> Session:
        """Connect, prove the shared secret each way, and return the session's MACs."""
        self.socket.connect(self._control)
        deadline = time.monotonic() + self.timeout_s
        nonce = os.urandom(NONCE_BYTES)
        self.send(Hello(nonce))
        challenge = self._expect(Challenge, deadline, closing)
        session = Session(self._key, nonce, challenge.nonce)
        if not session.challenge_ok(challenge.tag):
            raise LinkFailure("the listener does not hold our shared secret (challenge MAC mismatch)")
        self.send(Auth(session.auth_tag()))
        return session

    def send(self, message: Message) -> None:
        try:
            self.socket.send_multipart(encode(message))
        except zmq.Again as exc:
            raise LinkFailure(f"the listener's control socket took nothing for {self.timeout_s:g} s: dead, "
                              "unreachable, not reading, or it does not accept our shared secret") from exc

    def pending(self) -> bool:
        """Whether a message from the listener waits to be received."""
        return bool(self.socket.poll(0))

    def receive(self) -> Message:
        """The next message from the listener (one must be pending)."""
        try:
            message = decode(self.socket.recv_multipart(zmq.NOBLOCK))
        except ControlError as exc:
            raise LinkFailure(f"malformed control message from the listener: {exc}") from exc
        if isinstance(message, Reset):
            raise LinkFailure(f"the listener ended the session: {message.reason}")
        return message

    def wait(self, timeout_s: float) -> bool:
        """Sleep until a message comes, the link is woken, or ``timeout_s`` passes; whether a message came."""
        ready = dict(self._poller.poll(max(1, round(timeout_s * 1000))))
        self._clear_wake()
        return self.socket in ready

    def close(self) -> None:
        self.socket.close(linger=0)

    def _expect(self, kind: type, deadline: float, closing: Callable[[], bool]):
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise LinkFailure(f"no answer from the listener within {self.timeout_s:g} s: dead, unreachable, "
                                  "or it does not accept our shared secret")
            if closing():
                raise LinkFailure("closed")
            if self.wait(remaining):
                message = self.receive()
                if isinstance(message, kind):
                    return message
                if not isinstance(message, Ping):
                    raise LinkFailure(f"expected {kind.__name__} from the listener, got {type(message).__name__}")

    def _clear_wake(self) -> None:
        try:
            while os.read(self._wake_fd, 4096):
                pass
        except BlockingIOError:
            pass
