"""ZeroMQ/TCP transport: one PUSH socket per peer endpoint, one PULL socket per listener.

Each object owns its own ``zmq.Context`` (never the process-wide instance), so
closing one never disturbs another. Given ``CurveKeys`` (derived from the
shared secret, `lynx.transfer.keys`), every connection is CurveZMQ: encrypted,
and the listener's authentication handler (ZAP) admits only a peer holding the
sender key pair, before a single byte of its messages is buffered.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import zmq
from zmq.utils import z85

from lynx.transfer.keys import CurveKeys
from lynx.transfer.transport import Listener, Transport, TransportError

ZAP_ENDPOINT = "inproc://zeromq.zap.01"


class ZmqTransport(Transport):
    """Sends over ZeroMQ PUSH sockets, created lazily per endpoint.

    Sockets use LINGER 0 (close drops what is queued), SNDHWM
    ``high_water_mark`` messages (little is queued ahead of the sender's
    priority scheduler), SNDTIMEO ``send_timeout_s`` and IMMEDIATE (messages
    queue only on completed connections, so a dead peer makes ``send`` time
    out instead of filling a queue). One lock per socket: ``send`` is
    thread-safe. Sends are zero-copy: ZeroMQ holds a reference to each part
    until it is on the wire. A socket no ``send`` or ``ready`` asked for in
    ``idle_close_s`` seconds (``clock``) is closed; the next send opens a new
    one.
    """

    def __init__(
        self,
        send_timeout_s: float = 30.0,
        high_water_mark: int = 4,
        *,
        curve: CurveKeys | None = None,
        idle_close_s: float = 300.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not send_timeout_s > 0:
            raise ValueError(f"send_timeout_s must be > 0, got {send_timeout_s!r}")
        if not isinstance(high_water_mark, int) or high_water_mark < 1:
            raise ValueError(f"high_water_mark must be an int >= 1, got {high_water_mark!r}")
        if not idle_close_s > send_timeout_s:
            raise ValueError(f"idle_close_s must exceed send_timeout_s ({send_timeout_s:g}), got {idle_close_s!r}")
        self.send_timeout_s = float(send_timeout_s)
        self.high_water_mark = high_water_mark
        self.idle_close_s, self._clock = float(idle_close_s), clock
        self._curve = curve
        self._context = zmq.Context()
        self._sockets: dict[str, tuple[zmq.Socket, threading.Lock]] = {}
        self._used: dict[str, float] = {}  # endpoint -> when a send or ready last asked for its socket
        self._lock = threading.Lock()
        self._closed = False

    def send(self, endpoint: str, parts: list) -> None:
        """Hand ``parts`` to the socket for ``endpoint``; raise TransportError after ``send_timeout_s``."""
        self._close_idle(keep=endpoint)
        socket, lock = self._socket(endpoint)
        with lock:
            if socket.closed:
                raise TransportError(f"transport closed while sending to {endpoint}")
            try:
                socket.send_multipart(parts, copy=False)
            except zmq.Again as exc:
                raise TransportError(
                    f"send to {endpoint} timed out after {self.send_timeout_s:g} s: "
                    "peer dead, unreachable or not reading"
                ) from exc
            except zmq.ZMQError as exc:
                raise TransportError(f"send to {endpoint} failed: {exc}") from exc

    def ready(self, endpoint: str) -> bool:
        """Whether the socket for ``endpoint`` is connected and below its high-water mark."""
        socket, lock = self._socket(endpoint)
        with lock:
            return not socket.closed and bool(socket.poll(0, zmq.POLLOUT))

    @property
    def endpoints(self) -> tuple[str, ...]:
        """The endpoints with a socket open now."""
        with self._lock:
            return tuple(self._sockets)

    def close(self) -> None:
        """Close every socket (dropping unsent messages) and the context; idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            sockets = list(self._sockets.values())
            self._sockets.clear()
        for socket, lock in sockets:
            with lock:
                socket.close(linger=0)
        self._context.term()

    def _socket(self, endpoint: str) -> tuple[zmq.Socket, threading.Lock]:
        with self._lock:
            if self._closed:
                raise TransportError(f"transport is closed; cannot send to {endpoint}")
            entry = self._sockets.get(endpoint)
            if entry is None:
                socket = self._context.socket(zmq.PUSH)
                socket.setsockopt(zmq.LINGER, 0)
                socket.setsockopt(zmq.SNDHWM, self.high_water_mark)
                socket.setsockopt(zmq.SNDTIMEO, max(1, round(self.send_timeout_s * 1000)))
                socket.setsockopt(zmq.IMMEDIATE, 1)
                if self._curve is not None:
                    socket.curve_serverkey = self._curve.server_public
                    socket.curve_publickey = self._curve.client_public
                    socket.curve_secretkey = self._curve.client_secret
                try:
                    socket.connect(endpoint)
                except zmq.ZMQError as exc:
                    socket.close(linger=0)
                    raise TransportError(f"cannot connect to {endpoint}: {exc}") from exc
                entry = self._sockets[endpoint] = (socket, threading.Lock())
            self._used[endpoint] = self._clock()
            return entry

    def _close_idle(self, keep: str) -> None:
        """Close the sockets (but `keep`'s) no send or ready asked for in ``idle_close_s``."""
        now = self._clock()
        with self._lock:
            idle = [e for e in self._sockets if e != keep and now - self._used.get(e, now) >= self.idle_close_s]
            closing = [self._sockets.pop(endpoint) for endpoint in idle]
            for endpoint in idle:
                self._used.pop(endpoint, None)
        for socket, lock in closing:
            with lock:
                socket.close(linger=0)


class ZmqListener(Listener):
    """A PULL socket bound to ``tcp://host:port`` (port 0 picks a free port).

    ``max_message_bytes`` bounds every message part (ZMQ_MAXMSGSIZE): ZeroMQ
    itself refuses a larger part and disconnects the peer. It does not bound
    the number of parts of one message, which ZeroMQ buffers whole; with
    ``curve`` only peers holding the shared secret get that far.
    ``recv`` and ``close`` are serialized by a lock; use ``recv`` from one
    thread.
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        max_message_bytes: int,
        high_water_mark: int = 64,
        curve: CurveKeys | None = None,
    ) -> None:
        if not isinstance(max_message_bytes, int) or max_message_bytes < 1:
            raise ValueError(f"max_message_bytes must be an int >= 1, got {max_message_bytes!r}")
        if not isinstance(port, int) or not 0 <= port <= 65535:
            raise ValueError(f"port must be an int in 0..65535, got {port!r}")
        if not isinstance(high_water_mark, int) or high_water_mark < 1:
            raise ValueError(f"high_water_mark must be an int >= 1, got {high_water_mark!r}")
        self.max_message_bytes = max_message_bytes
        self._server = ServerContext(curve)
        self._socket = self._server.context.socket(zmq.PULL)
        self._socket.setsockopt(zmq.LINGER, 0)
        self._socket.setsockopt(zmq.MAXMSGSIZE, max_message_bytes)
        self._socket.setsockopt(zmq.RCVHWM, high_water_mark)
        if curve is not None:
            self._socket.curve_server = True
            self._socket.curve_publickey = curve.server_public
            self._socket.curve_secretkey = curve.server_secret
        try:
            self._socket.bind(f"tcp://{host}:{port or '*'}")
        except zmq.ZMQError as exc:
            self._server.close(self._socket)
            raise TransportError(f"cannot listen on tcp://{host}:{port}: {exc}") from exc
        self._endpoint = self._socket.getsockopt_string(zmq.LAST_ENDPOINT)
        self._poller = zmq.Poller()
        self._poller.register(self._socket, zmq.POLLIN)
        self._lock = threading.Lock()
        self._closed = False

    @property
    def endpoint(self) -> str:
        """``tcp://host:port`` with the port actually bound."""
        return self._endpoint

    def recv(self, timeout_s: float) -> list[bytes] | None:
        """The next message's parts, or None after ``timeout_s`` seconds without one."""
        with self._lock:
            if self._closed:
                raise TransportError(f"listener {self._endpoint} is closed")
            if not self._poller.poll(max(0, round(timeout_s * 1000))):
                return None
            return self._socket.recv_multipart(zmq.NOBLOCK)

    def close(self) -> None:
        """Unbind and release the socket; idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._server.close(self._socket)


class ServerContext:
    """A listener's ZeroMQ context and, with `curve`, the ZAP handler that admits its CURVE clients."""

    def __init__(self, curve: CurveKeys | None) -> None:
        self.context = zmq.Context()
        self._zap = ZapHandler(self.context, curve.client_public) if curve is not None else None

    def close(self, socket: zmq.Socket | None = None) -> None:
        """Close `socket` (the listener's, if it has one yet), the ZAP handler and the context."""
        if socket is not None:
            socket.close(linger=0)
        if self._zap is not None:
            self._zap.close()
        self.context.term()


class ZapHandler:
    """ZeroMQ's authentication hook for one context: admits CURVE clients holding `client_public`.

    Rejected handshakes never reach the listener's queue, so they cost no memory.
    """

    def __init__(self, context: zmq.Context, client_public: bytes) -> None:
        self._allowed = z85.decode(client_public)
        self._socket = context.socket(zmq.REP)
        self._socket.setsockopt(zmq.LINGER, 0)
        self._socket.bind(ZAP_ENDPOINT)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="lynx-zap", daemon=True)
        self._thread.start()
        self.rejected = 0

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                if not self._socket.poll(100):
                    continue
                request = self._socket.recv_multipart()
            except zmq.ZMQError:
                return
            version, request_id, mechanism = request[0], request[1], request[5]
            credentials = request[6] if len(request) > 6 else b""
            admitted = mechanism == b"CURVE" and credentials == self._allowed
            self.rejected += not admitted
            status = (b"200", b"OK") if admitted else (b"400", b"peer does not hold the shared secret")
            try:
                self._socket.send_multipart([version, request_id, *status, b"", b""])
            except zmq.ZMQError:
                return

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self._socket.close(linger=0)
