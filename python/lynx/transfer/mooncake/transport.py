"""Mooncake transport: messages written with Mooncake's TransferEngine into the listener's registered arena.

``send`` copies a message's large parts into a registered staging slot and
queues it on the endpoint's link; the link (one thread per endpoint) writes
it with the engine into a slot the listener granted, several writes in
flight, and notifies the listener over the control socket, in order, once
each write has landed. A link unused for ``idle_close_s`` with nothing
queued is closed (its thread and socket end); the next send opens a new
one. ``mooncake.listener.MooncakeListener`` is the other end;
``mooncake.control`` has the endpoint string, the protocol and the threat
model. ``PrioritySender`` runs on top unchanged (priority, chunking, pacing
and frame MACs are its business).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import zmq

from lynx.transfer.buffers import byte_view
from lynx.transfer.keys import curve_keys
from lynx.transfer.mooncake.control import MAX_PARTS, MooncakeEndpoint, is_inline
from lynx.transfer.mooncake.engine import MooncakeEngine
from lynx.transfer.mooncake.link import Job, Link, LinkConfig, LinkState
from lynx.transfer.mooncake.staging import Staging
from lynx.transfer.mooncake.listener import ListenerStats, MooncakeListener
from lynx.transfer.transport import Transport, TransportError

__all__ = ["ListenerStats", "MooncakeListener", "MooncakeTransport"]

_U32 = (1 << 32) - 1


class MooncakeTransport(Transport):
    """Sends to ``MooncakeListener`` endpoints (``mooncake://...``) with Mooncake's TransferEngine.

    Args:
        key: shared secret of the control plane (the listener's ``key``): CurveZMQ
            keys and MACs; ``b""`` for plaintext without authentication.
        send_timeout_s: how long a handshake, a credit, a write or room in the
            queue may take before the endpoint's link fails; ``send`` then
            raises TransportError (about one ``send_timeout_s`` after the peer
            stopped taking messages, two at most) and the next send reconnects.
        host, protocol, device: this side's engine (``host`` is what it advertises).
        staging_slots, staging_slot_bytes: registered send buffers (shared by
            all endpoints); a message's large parts are copied into one, so
            the caller may reuse its buffers as soon as ``send`` returns.
        staging_per_endpoint: staging slots one endpoint's messages hold at
            most once its link is up (one before: a dead endpoint never gets
            past its handshake), so the others always find some (default:
            half of them).
        max_queued_messages: per endpoint, messages queued or in flight at most.
        release_credits_after_s: a link with nothing to send gives the
            listener's slots back after this long (other senders get them).
        idle_close_s: a link unused this long, with nothing queued, is closed.
        clock: seconds, monotonic; the clock of ``idle_close_s``.

    ``send`` returns once the message is staged and queued: as with ZeroMQ,
    handing over is not delivery. Messages to one endpoint arrive in the order
    ``send`` took them.
    """

    def __init__(
        self,
        key: bytes,
        *,
        send_timeout_s: float = 30.0,
        host: str = "127.0.0.1",
        protocol: str = "tcp",
        device: str = "",
        staging_slots: int = 8,
        staging_slot_bytes: int = 4 << 20,
        staging_per_endpoint: int | None = None,
        max_queued_messages: int = 64,
        release_credits_after_s: float = 0.5,
        idle_close_s: float = 300.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not send_timeout_s > 0:
            raise ValueError(f"send_timeout_s must be > 0, got {send_timeout_s!r}")
        per_endpoint = max(1, staging_slots // 2) if staging_per_endpoint is None else staging_per_endpoint
        for name, value in (("staging_slots", staging_slots), ("staging_slot_bytes", staging_slot_bytes),
                            ("staging_per_endpoint", per_endpoint), ("max_queued_messages", max_queued_messages)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        if not idle_close_s > send_timeout_s:
            raise ValueError(f"idle_close_s must exceed send_timeout_s ({send_timeout_s:g}), got {idle_close_s!r}")
        if not isinstance(key, (bytes, bytearray)):
            raise ValueError(f"key must be bytes, got {type(key).__name__}")
        self.send_timeout_s, self.protocol = float(send_timeout_s), protocol
        self.staging_per_endpoint, self.idle_close_s, self._clock = per_endpoint, float(idle_close_s), clock
        self._config = LinkConfig(bytes(key), self.send_timeout_s, max_queued_messages,
                                  curve_keys(bytes(key)) if key else None, release_credits_after_s)
        self.engine = MooncakeEngine(host, protocol, device)
        try:
            self.staging = Staging(self.engine, staging_slots, staging_slot_bytes)
        except BaseException:
            self.engine.close()
            raise
        self.context = zmq.Context()
        self._links: dict[str, Link] = {}
        self._used: dict[str, float] = {}  # endpoint -> when a send or ready last asked for its link
        self._retired: list[Link] = []
        self._lock = threading.Lock()
        self._closed = False

    def send(self, endpoint: str, parts: list) -> None:
        """Stage ``parts`` and queue them for ``endpoint``; raise TransportError if its link failed or stalled."""
        # The link fails within send_timeout_s of its peer stalling and frees what it held; this
        # backstop only bounds the wait for room held by links of other endpoints.
        deadline = time.monotonic() + 2 * self.send_timeout_s
        self._close_idle(keep=endpoint)
        link = self._link(endpoint)
        views = [byte_view(part) for part in parts]
        lengths = tuple(len(view) for view in views)
        large = [view for view in views if not is_inline(len(view))]
        nbytes = sum(len(view) for view in large)
        if len(views) > MAX_PARTS or any(length > _U32 for length in lengths):
            raise TransportError(f"a message to {endpoint} has more than {MAX_PARTS} parts or a part over 4 GiB")
        if nbytes > min(link.endpoint.slot_bytes, self.staging.slot_bytes):
            raise TransportError(f"a message to {endpoint} puts {nbytes} bytes in the arena; its slots hold "
                                 f"{link.endpoint.slot_bytes} and staging slots {self.staging.slot_bytes}")
        staging = None
        try:
            staging = self.staging.acquire(deadline, endpoint, self._quota(link)) if nbytes else None
            if staging is not None:
                self.staging.fill(staging, large)
            inline = tuple(bytes(view) for view in views if is_inline(len(view)))
            link.put(Job(lengths, inline, nbytes, staging), deadline)
        except BaseException:
            self.staging.release(staging)
            if link.state is LinkState.FAILED:
                self._retire(endpoint, link)
            raise

    def ready(self, endpoint: str) -> bool:
        """Whether ``send`` to ``endpoint`` would stage and queue a message without waiting.

        True when a staging buffer is free for the endpoint (within its
        quota) and its queue has room, and when its link has failed (``send``
        then raises at once).
        """
        with self._lock:
            link = self._links.get(endpoint)
            if link is not None:
                self._used[endpoint] = self._clock()
        if link is not None and link.state is LinkState.FAILED:
            return True
        return (link is None or link.has_room()) and self.staging.available(endpoint, self._quota(link)) > 0

    @property
    def endpoints(self) -> tuple[str, ...]:
        """The endpoints with a link open now."""
        with self._lock:
            return tuple(self._links)

    def close(self) -> None:
        """Stop every link (dropping queued messages), then the engine; idempotent.

        A link blocked handing a control message to an unreachable listener
        finishes that first: close may take up to ``send_timeout_s``.
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
            links = [*self._links.values(), *self._retired]
            self._links.clear()
            self._retired.clear()
        for link in links:
            link.close()
        self.context.term()
        self.engine.close()

    def _link(self, text: str) -> Link:
        try:
            endpoint = MooncakeEndpoint.parse(text)
        except ValueError as exc:
            raise TransportError(str(exc)) from exc
        if endpoint.protocol != self.protocol:
            raise TransportError(f"{text} speaks {endpoint.protocol}; this transport speaks {self.protocol}")
        with self._lock:
            if self._closed:
                raise TransportError(f"transport is closed; cannot send to {text}")
            link = self._links.get(text)
        if link is not None and link.state is LinkState.FAILED:
            self._retire(text, link)
            raise TransportError(link.error)
        with self._lock:
            if self._closed:
                raise TransportError(f"transport is closed; cannot send to {text}")
            link = self._links.get(text)
            if link is None:
                link = self._links[text] = Link(endpoint, text, self._config, self.engine, self.staging, self.context)
            self._used[text] = self._clock()
            return link

    def _quota(self, link: Link | None) -> int:
        """Staging slots the link's endpoint may hold: its share once the link is up, else one."""
        return self.staging_per_endpoint if link is not None and link.state is LinkState.READY else 1

    def _close_idle(self, keep: str) -> None:
        """Close the links (but `keep`'s) unused for ``idle_close_s`` with nothing queued or in flight."""
        now = self._clock()
        with self._lock:
            idle = [text for text, link in self._links.items()
                    if text != keep and now - self._used.get(text, now) >= self.idle_close_s and link.quiet]
            links = [self._links.pop(text) for text in idle]
            for text in idle:
                self._used.pop(text, None)
        for link in links:
            link.close()

    def _retire(self, text: str, link: Link) -> None:
        """Take a failed link out of service (the next send reconnects); close retired links that ended."""
        with self._lock:
            if self._links.get(text) is link:
                del self._links[text]
                self._used.pop(text, None)
                self._retired.append(link)
            ended = [old for old in self._retired if old.finished]
            self._retired = [old for old in self._retired if old not in ended]
        for old in ended:
            old.close()
