"""The transport interface: moves multipart messages, holds no policy.

Nothing above this interface assumes TCP: an endpoint is an opaque string
that a ``Listener`` reports and peers pass to ``Transport.send``. ZeroMQ is
one implementation; RDMA engines (Mooncake, NIXL) can be others.
"""

from __future__ import annotations

from abc import ABC, abstractmethod


class TransportError(RuntimeError):
    """A message could not be handed to the transport (dead or stalled peer, closed transport)."""


class Transport(ABC):
    """Sends messages to endpoints. Implementations are safe to call from several threads."""

    @abstractmethod
    def send(self, endpoint: str, parts: list) -> None:
        """Hand one multipart message (bytes-like parts) to the transport.

        Blocks until the transport has taken it, at most an implementation
        timeout; never forever on a dead peer. The caller must not modify the
        parts' buffers afterwards. Handing over is not delivery: end-to-end
        completion is the receiver's to report.

        Raises:
            TransportError: timeout or failure; the message names the endpoint.
        """

    def ready(self, endpoint: str) -> bool:
        """Whether ``send`` to ``endpoint`` would hand over a message without waiting.

        A sender serving several peers asks this first, so one slow or dead
        peer does not hold up the others. The default (always True) suits
        transports whose ``send`` never waits long.
        """
        return True

    @abstractmethod
    def close(self) -> None:
        """Release every connection; idempotent. Later sends raise TransportError."""

    def __enter__(self) -> Transport:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class Listener(ABC):
    """Receives messages sent to its endpoint. Safe to use from one thread at a time."""

    @property
    @abstractmethod
    def endpoint(self) -> str:
        """What peers pass to ``Transport.send`` to reach this listener."""

    @abstractmethod
    def recv(self, timeout_s: float) -> list[bytes] | None:
        """The next multipart message, or None if none came within ``timeout_s`` seconds."""

    @abstractmethod
    def close(self) -> None:
        """Stop listening and release the endpoint; idempotent."""

    def __enter__(self) -> Listener:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
