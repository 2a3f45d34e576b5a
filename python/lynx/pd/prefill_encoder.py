"""The prefill's encoder thread: snapshot each computed segment's KV, announce the room, queue its streams.

Jobs come from the scheduler thread one prefill chunk at a time (a batch).
Each segment is encoded from the pool into the mode's streams; segment 0 goes
after the room's manifest, MAC'd by the transfer's key. Anchors are queued on
the `PrioritySender` at once, residuals once the whole batch is encoded. The
last job of a room queues its request metadata and reports it Success.

A segment the running forward completes (`Streaming`) is encoded layer by
layer as the forward writes them (`lynx_patches.pd.layer_hooks`): each stream's
frames go to the sender as soon as their bytes are final, the same frames the
whole segment would have made.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch
from lynx.config import LynxConfig
from lynx.heads import transfer_room
from lynx.kvwire import WireFormat
from lynx.manifest import Manifest, dtype_name
from lynx.transfer.frames import AUX_STREAM
from lynx.transfer.keys import transfer_key
from lynx.transfer.sender import PrioritySender

from lynx.pd.control import RoomMetadata
from lynx.pd.layers import ForwardLayers
from lynx.pd.pool import PoolView
from lynx.pd.prefill_rooms import PrefillRooms
from lynx.pd.room_wires import RoomWires
from lynx.pd.segment_streams import Destination, Release, Route, SegmentStreams

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


@dataclass
class Streaming:
    """The segments a running prefill forward completes, to encode as its layers are written."""

    jobs: list[Job]
    layers: ForwardLayers


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
        self._config, self._secret, self._host = config, secret, host
        self._rooms, self._sender, self._stop, self._route = rooms, sender, stop, route
        self._wires = RoomWires(config, wire, sender)
        self._jobs: queue.Queue[Job | Streaming] = queue.Queue()
        self._held: list[tuple[int, Release]] = []  # (room, residuals) of the batch being encoded (encoder thread)
        self._pool: PoolView | None = None
        self._stream = None  # the encoder thread's device stream (GPU pools), made on first use
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

    def put_streaming(self, streaming: Streaming) -> None:
        """Queue the segments a forward about to run completes, to encode as it writes their layers."""
        self._jobs.put(streaming)

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

    def _run(self, job: Job | Streaming) -> None:
        if isinstance(job, Streaming):
            return self.stream(job)
        self._guarded(job, lambda: self.send(job))
        if job.last_of_batch:
            self._flush_held()

    def _flush_held(self) -> None:
        """Queue the residual frames held back for the batch just encoded (not those of aborted rooms)."""
        held, self._held = self._held, []
        live = self._rooms.not_aborted({room for room, _ in held})
        for room, release in held:
            if room in live:
                self._sender.submit(*release)

    def _guarded(self, job: Job, work: Callable[[], bool]) -> bool:
        """Run one step of a job: its result, or False after an error, which fails the job's room
        (here and on its decode ranks), never the thread."""
        try:
            return work()
        except Exception as exc:
            logger.exception("Lynx prefill: sending room %s failed", job.room)
            self._host.fail(job.room, f"lynx prefill: {exc}", self._rooms.targets(job.room))
            self._wires.forget(job.room)
            return False

    def stream(self, streaming: Streaming) -> None:
        """Encode the segments of a running forward layer by layer as it writes them; after each
        step the step's anchor frames of every segment are queued before its residual frames."""
        layers, progress, live, done = streaming.layers, {}, list(streaming.jobs), 0
        while live:
            written = layers.wait(done, self._stop)
            if written is None:
                for job in live:
                    self._host.fail(job.room, "lynx prefill: the prefill forward failed", self._rooms.targets(job.room))
                break
            live = [job for job in live if self._guarded(job, lambda job=job: self._advance(job, progress, written))]
            self._flush_held()
            done = written

    def send(self, job: Job) -> None:
        """Encode one job and queue its streams: anchors at once, residuals with the batch's last job.

        Holding a batch's residuals back until its every anchor is queued keeps
        a residual chunk from going out between two anchors of the same chunk
        (the sender's priority only orders what is queued).
        """
        if job.segment is not None:
            self._advance(job, {}, self.pool.shape(0).num_layers)
            return
        dests = self._rooms.start_encoding(job.room, self._host.failed)
        if not dests:
            self._wires.forget(job.room)
            return
        self._wires.finished(job.room)
        try:
            aux = self.pool.read_aux(job.aux_index)
        finally:
            aborted = self._rooms.end_encoding(job.room)
        if aborted:
            return
        for meta in dests:
            key = transfer_key(self._secret, meta.nonce)
            wire = transfer_room(job.room, self._route(meta).part)
            self._sender.submit(meta.data_endpoint, wire, AUX_STREAM, aux, key=key)
        self._flush_held()  # every stream of the room is queued before it is reported sent
        self._rooms.quiet(job.room)
        self._host.succeed(job.room)

    def _advance(self, job: Job, progress: dict[tuple[int, int], SegmentStreams], layers: int) -> bool:
        """Encode the segment's layers up to `layers` (all written) and queue every frame whose bytes
        are now final; True while layers remain. Abandons the segment (False) if its room was
        aborted or failed, or has no destination."""
        key = (job.room, job.segment)
        dests = self._rooms.start_encoding(job.room, self._host.failed)
        if not dests:
            progress.pop(key, None)
            self._wires.forget(job.room)
            return False
        try:
            segment = progress.get(key) or self._start(job, dests)
            with self._device_work():
                pool, index, lo = self.pool, self.pool.slot_index(job.slots), segment.layers_done
                for heads in segment.head_ranges:
                    k, v = pool.head_buffers(heads.first - pool.shard.first, heads.count)
                    encoded = self._wires.of(job.room).encode(k[lo:layers], v[lo:layers], index, job.first_token)
                    segment.write(heads, layers, encoded)
        finally:
            aborted = self._rooms.end_encoding(job.room)
        if aborted:
            progress.pop(key, None)
            self._wires.forget(job.room)
            return False
        if lo == 0 and job.segment == 0:
            for dest in segment.destinations:
                endpoint = dest.meta.data_endpoint
                manifest = self._manifest(job, dest.route, dest.wire)
                self._sender.submit_message(endpoint, dest.wire, manifest.seal(dest.key))
                nbytes = sum(manifest.stream_sizes) + manifest.aux_size
                self._rooms.announce(job.room, endpoint, dest.key, dest.wire, nbytes)
        for release in segment.release(layers, self._sender.chunk_bytes):
            if release.stream == 0:
                self._sender.submit(*release)
            else:
                self._held.append((job.room, release))
        if segment.done:
            progress.pop(key, None)
            return False
        progress[key] = segment
        return True

    def _device_work(self) -> contextlib.AbstractContextManager:
        """Where the encoder's reads and kernels run: on a GPU pool, the encoder thread's own
        stream, so they overlap a running forward instead of queuing behind it on the default
        stream (what they read was waited for: `ForwardLayers.wait`, or the forward's end)."""
        device = self.pool.device
        if device.type != "cuda":
            return contextlib.nullcontext()
        if self._stream is None:
            self._stream = torch.cuda.Stream(device)
        return torch.cuda.stream(self._stream)

    def _start(self, job: Job, dests: list[RoomMetadata]) -> SegmentStreams:
        """A segment's streams: empty buffers per distinct head range, nothing sent."""
        self._wires.choose(job.room, job.total, self.pool)
        wire_format = self._wires.of(job.room)
        shapes, destinations = {}, []
        for meta in dests:
            route = self._route(meta)
            if route.heads not in shapes:
                whole = self.pool.shape(job.total, route.heads.count)
                shapes[route.heads] = whole.segment(job.first_token, len(job.slots))
            key = transfer_key(self._secret, meta.nonce)
            wire = transfer_room(job.room, route.part)
            destinations.append(Destination(meta, route, key, wire, [0] * wire_format.num_streams))
        return SegmentStreams(wire_format, job.segment, shapes, destinations)

    def _manifest(self, job: Job, route: Route, wire: int) -> Manifest:
        """The announcement of one part of a room (`wire`): its heads' whole shape and segmentation."""
        pool, segment_tokens, wire_format = self.pool, self._config.segment_tokens, self._wires.of(job.room)
        shape = pool.shape(job.total, route.heads.count)
        parts = wire_format.segment_shapes(shape, segment_tokens)
        sizes = tuple(map(sum, zip(*(wire_format.stream_sizes(part) for part in parts))))
        return Manifest(
            wire, wire_format.mode, self._config.preset, shape.num_layers, shape.num_tokens, shape.kv_heads,
            shape.head_dim, dtype_name(shape.dtype), sizes, pool.aux_size, segment_tokens, route.heads.first,
        )  # fmt: skip
