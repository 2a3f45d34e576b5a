"""The sender's queues: one FIFO of signed chunks per priority class, queued bytes per endpoint, counters,
and each request's residual deadline (``deadlines.ResidualDeadlines``).

Bookkeeping only, with no lock and no thread: ``PrioritySender`` calls every
method under its own lock.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from lynx.transfer.deadlines import ANCHOR_CLASS, ResidualDeadlines
from lynx.transfer.policy import Pending, next_index


@dataclass(frozen=True)
class SenderStats:
    """A snapshot of the sender's counters.

    Attributes:
        sent_bytes_by_class: payload bytes handed to the transport, per priority class.
        chunks_sent: chunks handed to the transport.
        chunks_dropped: chunks dropped by ``cancel``, peer failures or ``close``.
        queued_bytes: payload bytes queued and not yet sent, all endpoints.
    """

    sent_bytes_by_class: Mapping[int, int]
    chunks_sent: int
    chunks_dropped: int
    queued_bytes: int


class Submission:
    """One submitted stream (``stream`` None: a raw message); its chunks share it."""

    def __init__(self, endpoint: str, room: int, stream: int | None, num_chunks: int) -> None:
        self.endpoint, self.room, self.stream = endpoint, room, stream
        self.remaining = num_chunks
        self.dropped = False


@dataclass(frozen=True, eq=False)
class Chunk:
    """One signed chunk: its place in the policy's order, its stream, its message parts and payload bytes."""

    pending: Pending
    submission: Submission
    parts: list
    nbytes: int


class SendQueues:
    """Chunks queued per priority class, FIFO within a class, and the bytes each endpoint has queued.

    A chunk's bytes count against its endpoint from ``add`` until ``release``
    (once it is sent) or ``drop``, so the chunk in flight still counts.
    ``deadlines`` (default: none, strict priority) decides when a residual
    goes before an anchor.
    """

    def __init__(self, deadlines: ResidualDeadlines | None = None) -> None:
        self.deadlines = deadlines if deadlines is not None else ResidualDeadlines(None)
        self._queues: dict[int, deque[Chunk]] = {}
        self._queued_bytes: dict[str, int] = {}
        self._sent_bytes: dict[int, int] = {}
        self._seq = self._chunks_sent = self._chunks_dropped = 0

    def queued_bytes(self, endpoint: str) -> int:
        """Payload bytes of ``endpoint`` queued or in flight."""
        return self._queued_bytes.get(endpoint, 0)

    def idle(self) -> bool:
        """Whether no endpoint has a byte queued or in flight."""
        return not self._queued_bytes

    def has_chunks(self) -> bool:
        """Whether any chunk waits in a queue."""
        return any(self._queues.values())

    def has_room(self, room: int) -> bool:
        """Whether a chunk of ``room`` waits in a queue."""
        return any(chunk.submission.room == room for queue in self._queues.values() for chunk in queue)

    def add(self, priority: int, submission: Submission, frames: list[tuple[list, int]], now: float | None = None) -> None:
        """Queue the ``(parts, payload_bytes)`` frames of ``submission`` at the tail of class ``priority``
        (at ``now``: the deadlines' FIFO clock)."""
        queue = self._queues.setdefault(priority, deque())
        for parts, nbytes in frames:
            queue.append(Chunk(Pending(priority, self._seq), submission, parts, nbytes))
            self.deadlines.queued(priority, submission.room, nbytes, now)
            self._seq += 1
        endpoint = submission.endpoint
        self._queued_bytes[endpoint] = self._queued_bytes.get(endpoint, 0) + sum(nbytes for _, nbytes in frames)

    def pop_next(self, ready: Callable[[str], bool], now: float = 0.0, bytes_per_s: float | None = None) -> Chunk | None:
        """Remove and return the chunk the policy sends next among those whose endpoint is ``ready``.

        ``ready`` is asked once per endpoint; it may ``drop`` the chunks of an
        endpoint it gives up, and the class being scanned is then passed over.
        None when no class has a chunk for a ready endpoint. An anchor yields
        to the oldest residual when ``deadlines`` says a residual is due at
        ``now`` on a link of ``bytes_per_s`` (None: rate unknown).
        """
        ready_by_endpoint: dict[str, bool] = {}
        heads = []
        for priority, queue in list(self._queues.items()):
            for index, chunk in enumerate(queue):
                endpoint = chunk.submission.endpoint
                if endpoint not in ready_by_endpoint:
                    ready_by_endpoint[endpoint] = ready(endpoint)
                    if not ready_by_endpoint[endpoint] and chunk not in self._queues[priority]:
                        break  # the endpoint was given up and its chunks dropped
                if ready_by_endpoint[endpoint]:
                    heads.append((priority, index, chunk))
                    break
        if not heads:
            return None
        pick = next_index([chunk.pending for _, _, chunk in heads])
        residuals = [i for i, (priority, _, _) in enumerate(heads) if priority != ANCHOR_CLASS]
        if heads[pick][0] == ANCHOR_CLASS and residuals and self.deadlines.due(heads[pick][2].nbytes, now, bytes_per_s):
            pick = residuals[next_index([heads[i][2].pending for i in residuals])]
        priority, index, chunk = heads[pick]
        del self._queues[priority][index]
        return chunk

    def drop(self, doomed: Callable[[Chunk], bool]) -> list[Chunk]:
        """Remove the queued chunks matching ``doomed``, mark their streams dropped, and return them."""
        dropped: list[Chunk] = []
        for priority, queue in self._queues.items():
            kept = deque(chunk for chunk in queue if not doomed(chunk))
            dropped.extend(chunk for chunk in queue if doomed(chunk))
            self._queues[priority] = kept
        for chunk in dropped:
            chunk.submission.dropped = True
            self.release(chunk.submission.endpoint, chunk.nbytes)
            self.deadlines.left(chunk.pending.priority, chunk.submission.room, chunk.nbytes, None)
        self._chunks_dropped += len(dropped)
        return dropped

    def clear(self) -> list[Chunk]:
        """Drop every queued chunk and forget every endpoint's bytes, those in flight included; return the chunks."""
        dropped = self.drop(lambda chunk: True)
        self._queued_bytes.clear()
        return dropped

    def release(self, endpoint: str, nbytes: int) -> None:
        """``nbytes`` of ``endpoint`` are no longer queued or in flight."""
        left = self._queued_bytes.get(endpoint, 0) - nbytes
        if left > 0:
            self._queued_bytes[endpoint] = left
        else:
            self._queued_bytes.pop(endpoint, None)

    def record_sent(self, chunk: Chunk, now: float) -> None:
        """Count ``chunk`` as handed to the transport at ``now``."""
        self.deadlines.left(chunk.pending.priority, chunk.submission.room, chunk.nbytes, now)
        self._chunks_sent += 1
        priority = chunk.pending.priority
        self._sent_bytes[priority] = self._sent_bytes.get(priority, 0) + chunk.nbytes

    def record_dropped(self, chunk: Chunk) -> None:
        """Count ``chunk``, already out of the queues (in flight), as dropped."""
        self.deadlines.left(chunk.pending.priority, chunk.submission.room, chunk.nbytes, None)
        self._chunks_dropped += 1

    def stats(self) -> SenderStats:
        """The counters now."""
        return SenderStats(
            sent_bytes_by_class=MappingProxyType(dict(self._sent_bytes)),
            chunks_sent=self._chunks_sent,
            chunks_dropped=self._chunks_dropped,
            queued_bytes=sum(self._queued_bytes.values()),
        )
