"""The prefill's encoder thread: snapshot each computed segment's KV, announce the room, queue its streams.

Jobs come from the scheduler thread one prefill chunk at a time (a batch).
Each segment is encoded from the pool into the mode's streams; segment 0 goes
after the room's manifest, MAC'd by the transfer's key. Anchors are queued on
the `PrioritySender` at once, residuals once the whole batch is encoded. The
last job of a room queues its request metadata and reports it Success.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple, Protocol

import numpy as np
from lynx.config import LynxConfig
from lynx.heads import HeadSlice, transfer_room
from lynx.kvwire import WireFormat
from lynx.manifest import Manifest, dtype_name
from lynx.transfer.frames import AUX_STREAM
from lynx.transfer.keys import transfer_key
from lynx.transfer.sender import PrioritySender

from lynx_patches.pd.control import RoomMetadata
from lynx_patches.pd.pool import PoolView
from lynx_patches.pd.prefill_rooms import PrefillRooms

logger = logging.getLogger(__name__)


class EncoderHost(Protocol):
    """What the encoder reports to the engine."""

    def succeed(self, room: int) -> None: ...

    def fail(self, room: int, reason: str, notify: tuple[tuple[str, int], ...] = ()) -> None: ...

    def failed(self, room: int) -> bool: ...


@dataclass
class Job:
    """Encode and send one segment of a room (its manifest first, for segment 0), or with
    `segment` None the request metadata, which completes the room."""

    room: int
    segment: int | None
    first_token: int = 0
    slots: np.ndarray | None = None
    total: int = 0
    aux_index: int = -1
    last_of_batch: bool = True  # the jobs one prefill chunk completed are a batch (see `PrefillEncoder.send`)


class Route(NamedTuple):
    """What one decode rank gets of this prefill rank's KV: these heads, as this part of its transfer."""

    heads: HeadSlice
    part: int


class _HeldStream(NamedTuple):
    """A residual stream waiting for the end of its batch: the arguments of `PrioritySender.submit`
    (``room`` is the part's wire id), and the request it belongs to."""

    endpoint: str
    room: int
    stream: int
    data: np.ndarray
    layer_bounds: list[int]
    key: bytes
    segment: int
    request: int


class PrefillEncoder:
    """Encodes queued jobs one at a time on the encoder thread (`loop`) and queues their streams.

    Args:
        config: the lynx config (preset and segment size of the manifest).
        wire: the mode's wire format.
        secret: the shared secret the transfer keys derive from.
        host: where rooms are reported done or failed.
        rooms: the rank's room bookkeeping (destinations, the abort fence, announced rooms).
        sender: where streams are queued.
        stop: set when the loop is to return.
        route: what a destination gets (its registration's `Route`).
    """

    def __init__(
        self,
        config: LynxConfig,
        wire: WireFormat,
        secret: bytes,
        host: EncoderHost,
        rooms: PrefillRooms,
        sender: PrioritySender,
        stop: threading.Event,
        route: Callable[[RoomMetadata], Route],
    ) -> None:
        self._config, self._wire, self._secret, self._host = config, wire, secret, host
        self._rooms, self._sender, self._stop, self._route = rooms, sender, stop, route
        self._jobs: queue.Queue[Job] = queue.Queue()
        self._held: list[_HeldStream] = []  # residuals of the batch being encoded (encoder thread)
        self._pool: PoolView | None = None
        self._pool_ready = threading.Event()

    def attach(self, pool: PoolView) -> None:
        self._pool = pool
        self._pool_ready.set()

    @property
    def pool(self) -> PoolView:
        """The pool view, once attached (waits for it)."""
        self._pool_ready.wait()
        return self._pool

    def put(self, jobs: list[Job]) -> None:
        """Queue the jobs one prefill chunk completed, as one batch."""
        for index, job in enumerate(jobs):
            job.last_of_batch = index == len(jobs) - 1
            self._jobs.put(job)

    def loop(self) -> None:
        """The encoder thread: run jobs until `stop` is set."""
        while not self._stop.is_set():
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

    def _run(self, job: Job) -> None:
        """Send one job; any error fails its room (here and on its decode ranks), never the thread."""
        try:
            self.send(job)
        except Exception as exc:
            logger.exception("Lynx prefill: sending room %s failed", job.room)
            self._host.fail(job.room, f"lynx prefill: {exc}", self._rooms.targets(job.room))
        finally:
            if job.last_of_batch:
                self._flush_held()

    def _flush_held(self) -> None:
        """Queue the residuals held back for the batch just encoded (not those of aborted rooms)."""
        held, self._held = self._held, []
        live = self._rooms.not_aborted({stream.request for stream in held})
        for stream in held:
            if stream.request in live:
                self._sender.submit(*stream[:-1])

    def send(self, job: Job) -> None:
        """Encode one job and queue its streams: anchors at once, residuals with the batch's last job.

        Holding a batch's residuals back until its every anchor is queued keeps
        a residual chunk from going out between two anchors of the same chunk
        (the sender's priority only orders what is queued).
        """
        dests = self._rooms.start_encoding(job.room, self._host.failed)
        if not dests:
            return
        try:
            pool = self.pool
            routes = [self._route(meta) for meta in dests]
            if job.segment is None:
                aux = pool.read_aux(job.aux_index)
            else:
                index, streams = pool.slot_index(job.slots), {}
                for heads in dict.fromkeys(route.heads for route in routes):  # each distinct range once
                    k, v = pool.head_buffers(heads.first - pool.shard.first, heads.count)
                    streams[heads] = self._wire.encode(k, v, index, job.first_token)
        finally:
            aborted = self._rooms.end_encoding(job.room)
        if aborted:
            return
        for meta, route in zip(dests, routes):
            key = transfer_key(self._secret, meta.nonce)
            wire = transfer_room(job.room, route.part)
            if job.segment is None:
                self._sender.submit(meta.data_endpoint, wire, AUX_STREAM, aux, key=key)
                continue
            if job.segment == 0:
                self._sender.submit_message(meta.data_endpoint, wire, self._manifest(job, route, wire).seal(key))
                self._rooms.announce(job.room, meta.data_endpoint, key, wire)
            shape = pool.shape(job.total, route.heads.count).segment(job.first_token, len(job.slots))
            bounds = self._wire.layer_bounds(shape)
            for stream, (data, layer_bounds) in enumerate(zip(streams[route.heads], bounds)):
                held = _HeldStream(
                    meta.data_endpoint, wire, stream, data.numpy(), layer_bounds, key, job.segment, job.room
                )
                if stream == 0:
                    self._sender.submit(*held[:-1])
                else:
                    self._held.append(held)
        if job.segment is None:
            self._rooms.quiet(job.room)
            self._host.succeed(job.room)

    def _manifest(self, job: Job, route: Route, wire: int) -> Manifest:
        """The announcement of one part of a room (`wire`): its heads' whole shape and segmentation."""
        pool, segment_tokens = self.pool, self._config.segment_tokens
        shape = pool.shape(job.total, route.heads.count)
        parts = self._wire.segment_shapes(shape, segment_tokens)
        sizes = tuple(map(sum, zip(*(self._wire.stream_sizes(part) for part in parts))))
        return Manifest(
            wire, self._wire.mode, self._config.preset, shape.num_layers, shape.num_tokens, shape.kv_heads,
            shape.head_dim, dtype_name(shape.dtype), sizes, pool.aux_size, segment_tokens, route.heads.first,
        )  # fmt: skip
