"""One sender's path to one Mooncake listener: credits and the write pipeline over its control `channel`.

A ``Link`` runs one thread. Messages queued by ``put`` (already copied into
``Staging``) are written with the engine into slots the listener granted,
several in flight, and notified in the order they were queued once their
write has landed. With nothing to send for ``LinkConfig.release_after_s`` it
gives its slots back, and asks again when messages come (`SenderCredits`).
Any deadline missed (handshake, credit, write, room in the queue) fails the
link: queued messages are dropped and the failure is raised by the next
``put``; the owner then opens a new link.
"""

from __future__ import annotations

import enum
import logging
import os
import threading
import time
from collections import deque
from dataclasses import dataclass

import zmq

from lynx.transfer.keys import CurveKeys
from lynx.transfer.mooncake.channel import LinkFailure, SenderChannel
from lynx.transfer.mooncake.control import NO_SLOT, Grant, MooncakeEndpoint, Notify, Ping, Release, Session, Want
from lynx.transfer.mooncake.credits import SenderCredits
from lynx.transfer.mooncake.engine import MooncakeEngine, WriteStatus
from lynx.transfer.mooncake.staging import Staging
from lynx.transfer.transport import TransportError

logger = logging.getLogger(__name__)

POLL_MIN_S, POLL_MAX_S = 50e-6, 800e-6


@dataclass(frozen=True)
class LinkConfig:
    """What every link of a transport shares: the secret (and its CurveZMQ keys), the deadline, the
    queue bound, and how long a link with nothing to send keeps the listener's slots."""

    key: bytes
    timeout_s: float
    max_queued: int
    curve: CurveKeys | None = None
    release_after_s: float = 0.5

    def __post_init__(self) -> None:
        if not self.release_after_s >= 0:
            raise ValueError(f"release_after_s must be >= 0, got {self.release_after_s!r}")


class LinkState(enum.Enum):
    """A link's life: CONNECTING -> READY -> (FAILED | CLOSED); FAILED -> CLOSED."""

    CONNECTING = "connecting"
    READY = "ready"
    FAILED = "failed"
    CLOSED = "closed"


@dataclass(eq=False)
class Job:
    """One message on its way: staged, then written into ``slot``, then notified."""

    lengths: tuple[int, ...]
    inline: tuple[bytes, ...]
    nbytes: int
    staging: int | None
    slot: int = NO_SLOT
    handle: int | None = None
    written: bool = False
    started_at: float = 0.0


class Link:
    """The path to one listener: its control connection, credits and write pipeline, run by one thread."""

    def __init__(self, endpoint: MooncakeEndpoint, text: str, config: LinkConfig, engine: MooncakeEngine,
                 staging: Staging, context: zmq.Context) -> None:
        self.endpoint, self.text, self.timeout_s = endpoint, text, config.timeout_s
        self._config, self._engine, self._staging, self._context = config, engine, staging, context
        self._cond = threading.Condition()
        self._jobs: deque[Job] = deque()
        self._inflight: deque[Job] = deque()
        self._state = LinkState.CONNECTING
        self.error: str | None = None
        self._pipe = os.pipe()
        self._wake_read, self._wake_write = self._pipe
        os.set_blocking(self._wake_read, False)
        os.set_blocking(self._wake_write, False)
        self._thread = threading.Thread(target=self._run, name="lynx-mooncake-link", daemon=True)
        self._thread.start()

    @property
    def state(self) -> LinkState:
        with self._cond:
            return self._state

    def has_room(self) -> bool:
        """Whether ``put`` would not wait (a failed link has room: ``put`` raises at once)."""
        with self._cond:
            return self._state not in (LinkState.CONNECTING, LinkState.READY) or (
                len(self._jobs) + len(self._inflight) < self._config.max_queued
            )

    @property
    def quiet(self) -> bool:
        """Whether nothing is queued or in flight."""
        with self._cond:
            return not self._jobs and not self._inflight

    def put(self, job: Job, deadline: float) -> None:
        """Queue a staged message; raise TransportError if the link failed or stays full past ``deadline``."""
        with self._cond:
            while self._state in (LinkState.CONNECTING, LinkState.READY) and (
                len(self._jobs) + len(self._inflight) >= self._config.max_queued
            ):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TransportError(f"send to {self.text} timed out: {len(self._jobs)} messages still queued")
                self._cond.wait(remaining)
            if self._state is LinkState.FAILED:
                raise TransportError(self.error)
            if self._state is LinkState.CLOSED:
                raise TransportError(f"transport closed while sending to {self.text}")
            self._jobs.append(job)
        self._wake()

    @property
    def finished(self) -> bool:
        """Whether the link's thread has ended (then ``close`` returns at once)."""
        return not self._thread.is_alive()

    def close(self) -> None:
        """Stop the thread (queued messages are dropped), wait for it, release the wake pipe; idempotent."""
        self._transition(LinkState.CLOSED)
        self._wake()
        self._thread.join()
        with self._cond:
            pipe, self._pipe = self._pipe, ()
        for fd in pipe:
            os.close(fd)

    def _transition(self, state: LinkState, error: str | None = None) -> None:
        with self._cond:
            if self._state is LinkState.CLOSED or (self._state is LinkState.FAILED and state is not LinkState.CLOSED):
                return
            self._state = state
            if error is not None:
                self.error = error
            if state in (LinkState.FAILED, LinkState.CLOSED):
                for job in self._jobs:
                    self._staging.release(job.staging)
                self._jobs.clear()
            self._cond.notify_all()

    def _wake(self) -> None:
        with self._cond:
            if not self._pipe:
                return
            try:
                os.write(self._wake_write, b"x")
            except BlockingIOError:
                pass

    def _run(self) -> None:
        config = self._config
        channel = SenderChannel(self._context, self.endpoint.control, config.key, self.timeout_s, config.curve,
                                self._wake_read)
        failed = False
        try:
            session = channel.handshake(self._closing)
            self._transition(LinkState.READY)
            self._pump(channel, session)
        except (LinkFailure, TransportError) as exc:
            failed = True
            self._transition(LinkState.FAILED, f"Mooncake send to {self.text} failed: {exc}")
        except Exception as exc:
            failed = True
            logger.exception("Mooncake link to %s crashed", self.text)
            self._transition(LinkState.FAILED, f"Mooncake send to {self.text} failed: {type(exc).__name__}: {exc}")
        finally:
            channel.close()
            self._settle(drain=failed)

    def _pump(self, channel: SenderChannel, session: Session) -> None:
        """Move messages: grants in, writes out, notifications in order, slots given back while
        idle; fail on any deadline."""
        credits = SenderCredits(self.endpoint.slots, self._config.release_after_s)
        seq = 0  # of this sender's next notification, release or want
        starved_since: float | None = None
        interval = POLL_MIN_S
        while not self._closing():
            while channel.pending():
                message = channel.receive()
                if isinstance(message, Ping):
                    continue
                if not isinstance(message, Grant):
                    raise LinkFailure(f"unexpected {type(message).__name__} from the listener")
                problem = "a bad MAC" if not session.check(message) else credits.accept(message)
                if problem is not None:
                    raise LinkFailure(f"the listener sent a grant with {problem}")
            pending, landed = self._poll_writes()
            while self._inflight and self._inflight[0].written:
                job = self._inflight[0]
                channel.send(session.sign(Notify(seq, job.slot, job.lengths, job.inline)))
                seq += 1
                with self._cond:
                    self._inflight.popleft()
                    self._cond.notify_all()
            started = self._start_writes(credits.slots)
            now = time.monotonic()
            with self._cond:
                waiting, busy = bool(self._jobs), bool(self._jobs or self._inflight)
            released = credits.to_release(busy, now)
            if released:
                channel.send(session.sign(Release(seq, released)))
                seq += 1
            if credits.to_want(waiting):
                channel.send(session.sign(Want(seq)))
                seq += 1
            starved_since = (starved_since or now) if waiting and not started else None
            if starved_since is not None and now - starved_since > self.timeout_s:
                raise LinkFailure(f"no credit from the listener for {self.timeout_s:g} s: it is not reading or gone")
            if pending:
                if pending[0].started_at + self.timeout_s < now:
                    raise LinkFailure(f"a {pending[0].nbytes}-byte write did not complete within {self.timeout_s:g} s")
                interval = POLL_MIN_S if landed or started else min(2 * interval, POLL_MAX_S)
                time.sleep(interval)
            elif not started:
                wait = self.timeout_s / 4 if starved_since is None else starved_since + self.timeout_s - now
                due = credits.release_due()
                wait = wait if due is None else min(wait, due - now)
                channel.wait(wait + 1e-3)

    def _poll_writes(self) -> tuple[list[Job], bool]:
        """Poll writes in flight; return those still pending and whether any landed. A failed write fails the link."""
        pending, landed = [], False
        for job in self._inflight:
            if job.handle is None or job.written:
                continue
            status = self._engine.status(job.handle)
            if status is WriteStatus.FAILED:
                job.handle = None
                raise LinkFailure(f"Mooncake failed a {job.nbytes}-byte write to {self.endpoint.session}")
            if status is WriteStatus.DONE:
                job.written, job.handle, landed = True, None, True
                self._staging.release(job.staging)
                job.staging = None
            else:
                pending.append(job)
        return pending, landed

    def _start_writes(self, credits: deque[int]) -> bool:
        started = False
        while True:
            with self._cond:
                if not self._jobs or (self._jobs[0].nbytes and not credits):
                    return started
                job = self._jobs.popleft()
                self._inflight.append(job)
            started = True
            if not job.nbytes:
                job.written = True
                continue
            job.slot, job.started_at = credits.popleft(), time.monotonic()
            staging = self._staging
            source = staging.address + job.staging * staging.slot_bytes
            job.handle = self._engine.write(self.endpoint.session, source, self.endpoint.slot_address(job.slot),
                                            job.nbytes)

    def _settle(self, drain: bool) -> None:
        """Release the staging of messages in flight; after a failure, first let their writes end."""
        deadline = time.monotonic() + (self.timeout_s if drain else 0.0)
        with self._cond:
            inflight = list(self._inflight)
            self._inflight.clear()
            self._cond.notify_all()
        for job in inflight:
            while job.handle is not None and time.monotonic() < deadline and not self._closing():
                status = self._engine.status(job.handle)
                if status is not WriteStatus.PENDING:
                    job.handle = None
                else:
                    time.sleep(1e-3)
            if job.handle is not None:
                if drain:
                    logger.error("a Mooncake write to %s never ended; its staging buffer is retired", self.text)
                continue
            self._staging.release(job.staging)

    def _closing(self) -> bool:
        with self._cond:
            return self._state is LinkState.CLOSED
