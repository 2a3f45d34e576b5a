"""The prioritized sender: one supervised worker thread that models one outgoing link.

Streams are cut into chunks and signed at submission (``chunking.sign_chunks``)
and queued in one FIFO per priority class (``send_queue.SendQueues``). The
worker asks ``policy.next_index`` which class head goes next (strict priority
across every request and peer), waits for the pacer, and hands the chunk to
the transport. A worker that raises (``supervise.Supervisor``) drops every
chunk queued or in flight, reports each of their rooms, and starts again.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence

from lynx.transfer.buffers import byte_view
from lynx.transfer.chunking import MAX_FRAME_PAYLOAD, sign_chunks
from lynx.transfer.deadlines import ResidualDeadlines
from lynx.transfer.frames import priority_of
from lynx.transfer.pacer import TokenBucket, Unpaced
from lynx.transfer.send_queue import Chunk, SendQueues, SenderStats, Submission
from lynx.transfer.stalls import StallWatch
from lynx.transfer.supervise import Supervisor
from lynx.transfer.transport import Transport, TransportError

logger = logging.getLogger(__name__)

STALL_POLL_S = 0.005


class PrioritySender:
    """Sends submitted streams chunk by chunk, lowest priority class first, FIFO within a class.

    Args:
        transport: where chunks go; the caller keeps ownership (and closes it).
        key: shared secret for the frame MACs (``b""``: unkeyed checksum).
        chunk_bytes: payload bytes per chunk (the last chunk of a stream may be
            shorter). Bounds how long a residual chunk can delay an anchor.
        pacer: ``Unpaced`` (default) or a ``TokenBucket`` emulating the link.
        max_inflight_bytes: per endpoint, the payload bytes queued and not yet
            sent may not exceed this; ``submit`` blocks for room.
        on_error: called ``(room, message)`` from the worker thread when a
            send to an endpoint fails: every chunk queued for that endpoint is
            dropped and each room that had some is reported once. Later
            submissions for the endpoint are tried afresh.
        on_sent: called ``(room, stream)`` from the worker thread when the last
            chunk of a submitted stream has been handed to the transport.
        submit_timeout_s: how long ``submit`` waits for room before raising
            TransportError; 0 raises at once.
        stall_timeout_s: an endpoint that cannot take a message
            (``Transport.ready`` false) for this long is given up: its chunks
            are dropped and ``on_error`` reports its rooms.
        clock: seconds, monotonic; passed to the pacer.
        restart_backoff_s: how long a crashed worker waits before it starts
            again. Each crash drops every queued chunk and reports each of
            their rooms to ``on_error``; after too many crashes the sender is
            ``broken`` and refuses new work.
        residual_window_s: a request's residual must have left this long
            after its anchor (its draft window, unless ``set_window`` names
            another); anchors go first only while every queued residual can
            still make it (``deadlines``). None: strict priority.
        residual_finish: on a paced link, a residual is due at its request's
            first-come-first-served finish plus half its window instead
            (``deadlines``, ``--lynx-residual-priority finish``).

    One link, strict priority among the endpoints that can take a message: a
    stalled or dead peer is skipped, never waited for, so it holds up nobody
    else. Submitted buffers are sent zero-copy: they must not be modified until
    ``on_sent`` fires for their stream (frames are signed at submission, so a
    modified buffer fails authentication at the receiver).
    """

    def __init__(
        self,
        transport: Transport,
        key: bytes,
        chunk_bytes: int = 1 << 20,
        pacer: Unpaced | TokenBucket | None = None,
        max_inflight_bytes: int = 1 << 30,
        on_error: Callable[[int, str], None] | None = None,
        *,
        on_sent: Callable[[int, int], None] | None = None,
        submit_timeout_s: float = 30.0,
        stall_timeout_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
        restart_backoff_s: float = 0.5,
        residual_window_s: float | None = None,
        residual_finish: bool = False,
    ) -> None:
        if not isinstance(chunk_bytes, int) or not 1 <= chunk_bytes <= MAX_FRAME_PAYLOAD:
            raise ValueError(f"chunk_bytes must be an int in 1..{MAX_FRAME_PAYLOAD}, got {chunk_bytes!r}")
        if not isinstance(max_inflight_bytes, int) or max_inflight_bytes < 1:
            raise ValueError(f"max_inflight_bytes must be an int >= 1, got {max_inflight_bytes!r}")
        if not submit_timeout_s >= 0:
            raise ValueError(f"submit_timeout_s must be >= 0, got {submit_timeout_s!r}")
        if not stall_timeout_s > 0:
            raise ValueError(f"stall_timeout_s must be > 0, got {stall_timeout_s!r}")
        self._transport, self._key = transport, bytes(key)
        self.chunk_bytes, self.max_inflight_bytes = chunk_bytes, max_inflight_bytes
        self._pacer = pacer if pacer is not None else Unpaced()
        self._on_error, self._on_sent = on_error, on_sent
        self._submit_timeout_s, self._clock = float(submit_timeout_s), clock
        self._stalls = StallWatch(float(stall_timeout_s))
        self._cond = threading.Condition()
        self._rate = getattr(self._pacer, "rate_bytes_per_s", None)
        fifo_rate = self._rate if residual_finish else None
        self._queues = SendQueues(ResidualDeadlines(residual_window_s, fifo_bytes_per_s=fifo_rate))
        self._current: Chunk | None = None
        self._closed = self._started = False
        self._supervisor = Supervisor(self._on_crash, backoff_s=restart_backoff_s)

    @property
    def link_bytes_per_s(self) -> float | None:
        """The paced link's rate, None when unpaced (the real link's rate is not known here)."""
        return self._rate

    @property
    def broken(self) -> str | None:
        """Why the worker stopped restarting (it kept crashing), or None."""
        return self._supervisor.broken

    def start(self) -> PrioritySender:
        """Start the worker thread (idempotent). Chunks submitted before it wait in the queues."""
        with self._cond:
            if self._closed:
                raise TransportError("sender is closed")
            if not self._started:
                self._started = True
                self._supervisor.start("lynx-priority-sender", self._run)
        return self

    def close(self) -> None:
        """Stop the worker, dropping every queued chunk (no ``on_error``); idempotent."""
        with self._cond:
            self._closed = True
            self._queues.clear()
            self._cond.notify_all()
            self._current = None
        self._supervisor.close()

    def __enter__(self) -> PrioritySender:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def submit(
        self,
        endpoint: str,
        room: int,
        stream: int,
        data,
        layer_bounds: Sequence[int] | None = None,
        key: bytes | None = None,
        segment: int = 0,
        frames: range | None = None,
    ) -> None:
        """Queue one stream of one request for ``endpoint``, or (``frames``) a run of its chunks.

        Args:
            data: the stream's bytes: bytes-like, or a C-contiguous-able CPU
                uint8 numpy array / torch tensor (any shape; flattened).
            layer_bounds: cumulative byte bounds of the model layers within
                the stream, ``[0, b1, ..., len(data)]``; each frame then
                carries the layer range it overlaps (``(0, 0)`` without).
            key: the MAC key of this stream's frames (default: the sender's).
            segment: the segment of the request's tokens this stream belongs to.
            frames: only these chunk indices of the stream (default: all), for
                a stream whose bytes are produced in order: each later run is
                submitted once its bytes are final, and the receiver sees the
                same frames as from one submission.

        Raises:
            ValueError: bad arguments, or the chunks exceed ``max_inflight_bytes``.
            TransportError: no room within ``submit_timeout_s``, or the sender is closed.
        """
        priority = priority_of(stream)
        view = byte_view(data)
        frames = sign_chunks(
            room, stream, view, self.chunk_bytes, self._key if key is None else key, layer_bounds, segment, frames
        )
        total = sum(nbytes for _, nbytes in frames)
        if not frames:
            return
        if total > self.max_inflight_bytes:
            raise ValueError(f"{total} bytes of a stream exceed max_inflight_bytes={self.max_inflight_bytes}")
        deadline = time.monotonic() + self._submit_timeout_s
        with self._cond:
            self._check_open(room, endpoint)
            while not self._closed and self._queues.queued_bytes(endpoint) + total > self.max_inflight_bytes:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TransportError(
                        f"no room to queue {total} bytes for {endpoint} within {self._submit_timeout_s:g} s: "
                        f"{self._queues.queued_bytes(endpoint)} bytes still queued (max_inflight_bytes="
                        f"{self.max_inflight_bytes}); the peer or link is too slow"
                    )
                self._cond.wait(remaining)
            self._check_open(room, endpoint)
            self._queues.add(priority, Submission(endpoint, room, stream, len(frames)), frames, self._clock())
            self._cond.notify_all()

    def submit_message(self, endpoint: str, room: int, parts: list) -> None:
        """Queue one raw multipart message for ``endpoint`` in the first priority class.

        For a request's announcement: it goes after anchors already queued and
        before the request's own frames, submitted next. Never waits for room.
        """
        nbytes = sum(len(memoryview(part)) for part in parts)
        with self._cond:
            self._check_open(room, endpoint)
            self._queues.add(0, Submission(endpoint, room, None, 1), [(list(parts), nbytes)], self._clock())
            self._cond.notify_all()

    def set_window(self, room: int, window_s: float) -> None:
        """The draft window of ``room``'s request: its residual is due this long after its anchor left."""
        with self._cond:
            self._queues.deadlines.set_window(room, window_s)

    def cancel(self, room: int) -> int:
        """Drop every queued chunk of ``room`` (all streams, all endpoints); return how many."""
        with self._cond:
            dropped = self._drop(lambda chunk: chunk.submission.room == room)
            if self._current is not None and self._current.submission.room == room:
                self._current.submission.dropped = True
            return len(dropped)

    def queued(self, room: int) -> bool:
        """Whether a chunk of ``room`` is queued or in flight."""
        with self._cond:
            current = self._current
            return (current is not None and current.submission.room == room) or self._queues.has_room(room)

    def stats(self) -> SenderStats:
        """Counters since construction."""
        with self._cond:
            return self._queues.stats()

    def wait_idle(self, timeout_s: float) -> bool:
        """Block until every queued chunk is sent or dropped; False after ``timeout_s`` seconds."""
        with self._cond:
            return self._cond.wait_for(lambda: self._queues.idle() and self._current is None, timeout_s)

    def _check_open(self, room: int, endpoint: str) -> None:
        """Raise TransportError if the sender takes no more work; caller holds the lock."""
        if self._closed:
            raise TransportError(f"sender is closed; cannot send room {room} to {endpoint}")
        if self.broken is not None:
            raise TransportError(f"sender is broken ({self.broken}); cannot send room {room} to {endpoint}")

    def _drop(self, doomed: Callable[[Chunk], bool]) -> list[Chunk]:
        """Remove queued chunks matching ``doomed`` and wake the waiters; caller holds the lock."""
        dropped = self._queues.drop(doomed)
        self._cond.notify_all()
        return dropped

    def _next_chunk(self) -> tuple[Chunk | None, list[tuple[list[int], str]]]:
        """Wait for a chunk some endpoint can take and pop the one the policy picks.

        Returns ``(chunk, reports)``: ``chunk`` is None once closed, or when
        endpoints were given up (``reports``: their rooms and the reason, for
        the caller to pass to ``on_error`` outside the lock).
        """
        with self._cond:
            while not self._closed:
                reports: list[tuple[list[int], str]] = []
                chunk = self._queues.pop_next(
                    lambda endpoint: self._endpoint_ready(endpoint, reports), self._clock(), self._rate
                )
                if chunk is not None:
                    self._current = chunk
                    return chunk, reports
                if reports:
                    return None, reports
                self._cond.wait(STALL_POLL_S if self._queues.has_chunks() else None)
            return None, []

    def _endpoint_ready(self, endpoint: str, reports: list) -> bool:
        """Whether ``endpoint`` can take a message; gives it up when stalled too long; caller holds the lock."""
        ready, give_up = self._stalls.check(endpoint, self._transport.ready)
        if give_up is not None:
            dropped = self._drop(lambda chunk: chunk.submission.endpoint == endpoint)
            reports.append((list(dict.fromkeys(chunk.submission.room for chunk in dropped)), give_up))
        return ready

    def _run(self) -> None:
        while True:
            chunk, reports = self._next_chunk()
            for rooms, message in reports:
                for room in rooms:
                    _call(self._on_error, room, message)
            if chunk is None:
                if self._supervisor.stop.is_set() or self._closed:
                    return
                continue
            wait = self._pacer.reserve(chunk.nbytes, self._clock())
            if wait > 0 and self._supervisor.stop.wait(wait):
                return
            failure = None
            if not chunk.submission.dropped:
                try:
                    self._transport.send(chunk.submission.endpoint, chunk.parts)
                except Exception as exc:
                    failure = str(exc) if isinstance(exc, TransportError) else f"{type(exc).__name__}: {exc}"
            self._finish(chunk, failure)

    def _finish(self, chunk: Chunk, failure: str | None) -> None:
        submission = chunk.submission
        with self._cond:
            self._current = None
            self._queues.release(submission.endpoint, chunk.nbytes)
            failed_rooms: list[int] = []
            done = False
            if failure is not None:
                submission.dropped = True
                self._queues.record_dropped(chunk)
                dropped = self._drop(lambda other: other.submission.endpoint == submission.endpoint)
                failed_rooms = list(dict.fromkeys([submission.room, *(other.submission.room for other in dropped)]))
            elif submission.dropped:
                self._queues.record_dropped(chunk)
            else:
                self._queues.record_sent(chunk, self._clock())
                submission.remaining -= 1
                done = submission.remaining == 0 and submission.stream is not None
            self._cond.notify_all()
        for room in failed_rooms:
            _call(self._on_error, room, failure)
        if done:
            _call(self._on_sent, submission.room, submission.stream)

    def _on_crash(self, name: str, error: str) -> None:
        """The worker raised: drop every chunk queued or in flight and report each of their rooms once."""
        with self._cond:
            current, self._current = self._current, None
            dropped = self._queues.clear()
            if current is not None:
                current.submission.dropped = True
                self._queues.record_dropped(current)
            self._cond.notify_all()
        carried = ([current] if current is not None else []) + dropped
        for room in dict.fromkeys(chunk.submission.room for chunk in carried):
            _call(self._on_error, room, f"the sender's worker failed ({error}); the room's queued KV was dropped")


def _call(callback: Callable | None, *args: object) -> None:
    """Run a user callback; its exceptions are logged, never kill the worker."""
    if callback is None:
        return
    try:
        callback(*args)
    except Exception:
        logger.exception("PrioritySender callback %r failed", callback)
