"""Prefill side of the lynx backend: learn destinations, encode KV, send it by priority.

The manager hands it decode registrations, per-request metadata (a transfer
nonce, the exact token count and the data endpoint of each decode rank) and
abort notices. On a request's last chunk a supervised encoder thread
snapshots the request's KV into the mode's streams (anchor first), announces
them with a manifest MAC'd by the transfer's key and hands both to the
`PrioritySender`, whose single link sends every queued anchor byte before any
residual byte and skips peers that do not read. The room is reported Success
once the snapshot is taken, so SGLang may free the prefill KV pages. An abort
that arrives while the encoder reads those pages waits for it (`busy`), and
the streams of an aborted request are never sent.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
from lynx.config import LynxConfig
from lynx.manifest import Manifest, dtype_name, wire_version
from lynx.transfer.frames import AUX_STREAM, encode_alive
from lynx.transfer.keys import transfer_key
from lynx.transfer.pacer import make_pacer
from lynx.transfer.select import make_transport
from lynx.transfer.sender import PrioritySender
from lynx.transfer.supervise import Supervisor

from lynx_patches.pd.control import (
    ControlError,
    DecodeRegistration,
    RoomMetadata,
    check_data_endpoint,
)
from lynx_patches.pd.pool import PoolView, page_slots

logger = logging.getLogger(__name__)

STALE_METADATA_S = 300.0
ALIVE_EVERY_S = 1.0


class PrefillHost(Protocol):
    """What the prefill side needs of the engine."""

    attn_tp_size: int

    def room_ready(self, room: int, decode_prefix_len: int) -> None: ...

    def succeed(self, room: int) -> None: ...

    def fail(self, room: int, reason: str, notify: tuple[tuple[str, int], ...] = ()) -> None:
        """Fail the room here unless it already succeeded, and tell the decode ranks in `notify`."""

    def failed(self, room: int) -> bool: ...


@dataclass
class _Outgoing:
    """A room whose KV leaves segment by segment as the prefill computes it (scheduler thread)."""

    total: int  # tokens the decode ranks reserved, exactly what must be sent
    layout: list[tuple[int, int]]  # (first_token, num_tokens) of each segment
    slots: list[np.ndarray] = field(default_factory=list)  # pool slots of the tokens computed so far
    computed: int = 0
    queued: int = 0  # segments handed to the encoder


@dataclass
class _Job:
    """Encode and send one segment of a room (its manifest first, for segment 0), or with
    `segment` None the request metadata, which completes the room."""

    room: int
    segment: int | None
    first_token: int = 0
    slots: np.ndarray | None = None
    total: int = 0
    aux_index: int = -1
    last_of_batch: bool = True  # the jobs one prefill chunk completed are a batch (see `_send`)


class PrefillSide:
    """One per prefill rank. Args: the config, the shared secret, the engine adapter, this rank's address."""

    def __init__(
        self, config: LynxConfig, secret: bytes, host: PrefillHost, address: str, clock=time.monotonic
    ) -> None:
        self.config, self.wire, self._secret, self._host, self._clock = config, config.wire, secret, host, clock
        self.peers: dict[str, DecodeRegistration] = {}
        self.refused: dict[str, str] = {}
        self._destinations: dict[int, dict[str, RoomMetadata]] = {}
        self._metadata_at: dict[int, float] = {}
        self._outgoing: dict[int, _Outgoing] = {}
        self._claims: set[int] = set()
        self._encoding: set[int] = set()
        self._aborted: set[int] = set()
        self._lock = threading.Condition()
        self._jobs: queue.Queue[_Job] = queue.Queue()
        self._held: list[tuple] = []  # residual submissions of the batch being encoded (encoder thread)
        self._alive: dict[int, list[tuple[str, bytes]]] = {}  # announced rooms still computing -> (endpoint, key)
        self._pool: PoolView | None = None
        self._pool_ready = threading.Event()
        self.transport = make_transport(config, secret, address)
        self.sender = PrioritySender(
            self.transport,
            secret,
            chunk_bytes=config.chunk_bytes,
            pacer=make_pacer(config.link_gbps, burst_bytes=config.chunk_bytes),
            on_error=self._on_send_error,
            submit_timeout_s=0,
        )
        self.supervisor = Supervisor(self._on_crash)

    @property
    def dropped(self) -> int:
        return self.sender.stats().chunks_dropped

    def live_count(self) -> int:
        with self._lock:
            return len(self._claims)

    def rooms_by_state(self) -> dict[str, int]:
        queued = self.sender.stats().queued_bytes
        with self._lock:
            return {"encoding": len(self._encoding), "claimed": len(self._claims), "queued_bytes": queued}

    def attach(self, pool: PoolView) -> None:
        self._pool = pool
        self._pool_ready.set()

    def start(self) -> None:
        self.sender.start()
        self.supervisor.start("LynxPrefillEncoder", self._encode_loop)
        self.supervisor.start("LynxPrefillAlive", self._alive_loop)

    def close(self) -> None:
        self.supervisor.close()
        self.sender.close()
        self.transport.close()

    # --- control (the manager's control thread) -------------------------------------------

    def on_registration(self, reg: DecodeRegistration, aux_item_lens: tuple[int, ...]) -> None:
        """A decode rank registers; a refusal is kept and named to each of its requests."""
        known = self.peers.get(reg.session_id)
        if known is not None and reg.issued_ns <= known.issued_ns:
            raise ControlError(f"ignored a stale registration of {reg.session_id} (replayed or reordered)")
        problem = None
        if reg.wire_version != wire_version():
            problem = f"decode {reg.session_id} speaks {reg.wire_version}, this prefill {wire_version()}"
        elif reg.attn_tp_size != self._host.attn_tp_size:
            problem = (
                f"decode {reg.session_id} runs attention TP {reg.attn_tp_size}, this prefill "
                f"{self._host.attn_tp_size}; the lynx backend needs equal TP sizes"
            )
        elif reg.aux_item_lens != aux_item_lens:
            problem = (
                f"decode {reg.session_id} has metadata buffers {reg.aux_item_lens}, this prefill "
                f"{aux_item_lens}; start both with the same options"
            )
        if problem is not None:
            self.refused[reg.session_id] = problem
            self.peers.pop(reg.session_id, None)
            raise ControlError(f"refused decode {reg.session_id}: {problem}")
        self.refused.pop(reg.session_id, None)
        self.peers[reg.session_id] = reg
        logger.info("Lynx prefill: decode %s registered", reg.session_id)

    def on_metadata(self, meta: RoomMetadata) -> None:
        """A decode rank's expectations of one request; all ranks in: the room may start."""
        if meta.session_id in self.refused:
            reason = f"this prefill refused the decode server: {self.refused[meta.session_id]}"
            self._host.fail(meta.room, reason, ((meta.endpoint, meta.dst_port),))
            return
        if meta.session_id not in self.peers:
            raise ControlError(f"metadata for room {meta.room} from unregistered {meta.session_id}")
        if not meta.is_dummy:
            check_data_endpoint(meta.data_endpoint, meta.endpoint)
        with self._lock:
            infos = self._destinations.setdefault(meta.room, {})
            infos[meta.session_id] = meta
            self._metadata_at.setdefault(meta.room, self._clock())
            complete = len(infos) == meta.required_dst_info_num
            real = [i for i in infos.values() if not i.is_dummy]
        if complete:
            self._host.room_ready(meta.room, real[0].decode_prefix_len if real else 0)

    def on_abort(self, room: int, reason: str) -> None:
        """A decode rank gave the request up: stop it, and fail it unless it already succeeded."""
        self.abort(room)
        self._host.fail(room, reason)

    def abort(self, room: int) -> None:
        """Nothing more of the room is encoded or sent."""
        with self._lock:
            self._aborted.add(room)
            self._alive.pop(room, None)
            self._outgoing.pop(room, None)
        self.sender.cancel(room)

    def purge(self) -> None:
        """Forget metadata of rooms no request ever claimed (the prefill never saw them)."""
        now = self._clock()
        with self._lock:
            stale = [r for r, t in self._metadata_at.items() if r not in self._claims and now - t > STALE_METADATA_S]
            for room in stale:
                self._destinations.pop(room, None)
                self._metadata_at.pop(room, None)
        if stale:
            logger.info("Lynx prefill: dropped metadata of %d rooms that never arrived here", len(stale))

    # --- SGLang's sender (scheduler thread) -------------------------------------------------

    def claim(self, room: int) -> bool:
        """Claim `room` for a new sender; False if a live sender holds it (a duplicate)."""
        with self._lock:
            if room in self._claims:
                return False
            self._claims.add(room)
            self._aborted.discard(room)
            return True

    def release(self, room: int) -> None:
        """The sender ended: forget the room (queued bytes of it stay queued unless aborted)."""
        with self._lock:
            self._claims.discard(room)
            self._outgoing.pop(room, None)
            self._alive.pop(room, None)
            self._destinations.pop(room, None)
            self._metadata_at.pop(room, None)
            self._aborted.discard(room)

    def busy(self, room: int) -> bool:
        """Whether the encoder is reading the room's KV pages right now (they must not be freed)."""
        with self._lock:
            return room in self._encoding

    def add_chunk(self, room: int, pages, is_last: bool, aux_index, num_tokens) -> None:
        """Called by SGLang's sender for each prefilled chunk: queue every segment it completes."""
        pages = np.asarray(pages, dtype=np.int64)
        page_size = self.pool.page_size
        count = len(pages) * page_size if num_tokens is None else int(num_tokens)
        jobs, problem = [], None
        with self._lock:
            dests = [m for m in self._destinations.get(room, {}).values() if not m.is_dummy]
            if not dests or room in self._aborted:
                return
            out = self._outgoing.get(room)
            if out is None:
                total = dests[0].num_tokens
                out = self._outgoing[room] = _Outgoing(total, self.wire.segments(total, self.config.segment_tokens))
            out.slots.append(page_slots(pages, page_size, count))
            out.computed += count
            if out.computed > out.total or (is_last and out.computed != out.total):
                problem = f"the decode ranks reserved {out.total} tokens, this prefill has {out.computed} to send"
            while problem is None and out.queued < len(out.layout) and sum(out.layout[out.queued]) <= out.computed:
                first, tokens = out.layout[out.queued]
                slots = np.concatenate(out.slots)[first : first + tokens]
                jobs.append(_Job(room, out.queued, first, slots, out.total))
                out.queued += 1
            if is_last or problem is not None:
                self._outgoing.pop(room, None)
        if problem is not None:
            self._host.fail(room, problem, self._targets(room))
            return
        if is_last:
            jobs.append(_Job(room, None, aux_index=aux_index))
        for index, job in enumerate(jobs):
            job.last_of_batch = index == len(jobs) - 1
            self._jobs.put(job)

    @property
    def pool(self) -> PoolView:
        self._pool_ready.wait()
        return self._pool

    # --- encoder thread ---------------------------------------------------------------------

    def _encode_loop(self) -> None:
        while not self.supervisor.stop.is_set():
            try:
                job = self._jobs.get(timeout=0.5)
            except queue.Empty:
                continue
            try:
                self._run(job)
            finally:
                self._jobs.task_done()

    def drain(self, timeout_s: float) -> bool:
        """Wait until every queued job is encoded and its streams handed to the sender."""
        with self._jobs.all_tasks_done:
            return self._jobs.all_tasks_done.wait_for(lambda: self._jobs.unfinished_tasks == 0, timeout_s)

    def _run(self, job: _Job) -> None:
        """Send one job; any error fails its room (here and on its decode ranks), never the thread."""
        try:
            self._send(job)
        except Exception as exc:
            logger.exception("Lynx prefill: sending room %s failed", job.room)
            self._host.fail(job.room, f"lynx prefill: {exc}", self._targets(job.room))
        finally:
            if job.last_of_batch:
                self._flush_held()

    def _flush_held(self) -> None:
        """Queue the residuals held back for the batch just encoded (not those of aborted rooms)."""
        held, self._held = self._held, []
        with self._lock:
            live = [submission for submission in held if submission[1] not in self._aborted]
        for submission in live:
            self.sender.submit(*submission)

    def _alive_loop(self) -> None:
        """While an announced room's prefill is still computing, tell its decode ranks so every
        `ALIVE_EVERY_S`: their no-progress timeout then only fires on a real stall."""
        while not self.supervisor.stop.wait(ALIVE_EVERY_S):
            with self._lock:
                targets = [(room, list(peers)) for room, peers in self._alive.items()]
            for room, peers in targets:
                for endpoint, key in peers:
                    self.sender.submit_message(endpoint, room, encode_alive(room, key))

    def _on_crash(self, name: str, error: str) -> None:
        logger.error("Lynx prefill: %s restarted after: %s", name, error)

    def _send(self, job: _Job) -> None:
        """Encode one job and queue its streams: anchors at once, residuals with the batch's last job.

        Holding a batch's residuals back until its every anchor is queued keeps
        a residual chunk from going out between two anchors of the same chunk
        (the sender's priority only orders what is queued).
        """
        with self._lock:
            dests = [m for m in self._destinations.get(job.room, {}).values() if not m.is_dummy]
            if job.room in self._aborted or self._host.failed(job.room) or not dests:
                return
            self._encoding.add(job.room)
        try:
            pool = self.pool
            if job.segment is None:
                aux = pool.read_aux(job.aux_index)
            else:
                shape = pool.shape(job.total).segment(job.first_token, len(job.slots))
                streams = self.wire.encode(pool.k_buffers, pool.v_buffers, pool.slot_index(job.slots), job.first_token)
        finally:
            with self._lock:
                self._encoding.discard(job.room)
                aborted = job.room in self._aborted
        if aborted:
            return
        for meta in dests:
            key = transfer_key(self._secret, meta.nonce)
            if job.segment is None:
                self.sender.submit(meta.data_endpoint, job.room, AUX_STREAM, aux, key=key)
                continue
            if job.segment == 0:
                self.sender.submit_message(meta.data_endpoint, job.room, self._manifest(job).seal(key))
                with self._lock:
                    self._alive.setdefault(job.room, []).append((meta.data_endpoint, key))
            bounds = self.wire.layer_bounds(shape)
            for stream, (data, layer_bounds) in enumerate(zip(streams, bounds)):
                submission = (meta.data_endpoint, job.room, stream, data.numpy(), layer_bounds, key, job.segment)
                if stream == 0:
                    self.sender.submit(*submission)
                else:
                    self._held.append(submission)
        if job.segment is None:
            with self._lock:
                self._alive.pop(job.room, None)
            self._host.succeed(job.room)

    def _manifest(self, job: _Job) -> Manifest:
        """The room's announcement: its whole shape and segmentation."""
        pool, segment_tokens = self.pool, self.config.segment_tokens
        shape = pool.shape(job.total)
        parts = self.wire.segment_shapes(shape, segment_tokens)
        sizes = tuple(map(sum, zip(*(self.wire.stream_sizes(part) for part in parts))))
        return Manifest(
            job.room, self.wire.mode, self.config.preset, shape.num_layers, shape.num_tokens, shape.kv_heads,
            shape.head_dim, dtype_name(shape.dtype), sizes, pool.aux_size, segment_tokens,
        )  # fmt: skip

    def _on_send_error(self, room: int, message: str) -> None:
        logger.error("Lynx prefill: room %s: %s", room, message)
        with self._lock:
            self._alive.pop(room, None)
        self._host.fail(room, message, self._targets(room))

    def _targets(self, room: int) -> tuple[tuple[str, int], ...]:
        """The control addresses of the decode ranks a room's KV goes to."""
        with self._lock:
            infos = self._destinations.get(room, {}).values()
            return tuple(dict.fromkeys((m.endpoint, m.dst_port) for m in infos if not m.is_dummy))
