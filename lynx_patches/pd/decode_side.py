"""Decode side of the lynx backend: receive streams, dequantize into the KV pool, report.

A data thread owns a `ZmqListener` (frame size bounded by `--lynx-chunk-bytes`).
Per request it expects a signed manifest, then frames that `RequestAssembly`
places into preallocated buffers; anything malformed, unauthenticated, out of
range or duplicated fails that request with the reason and writes nothing.
Only requests this rank reserved slots for are accepted, so a peer cannot make
it allocate memory or write outside the request's slots.

When the anchor (stream 0 and the request metadata) has landed, its
dequantized values are written into the request's slots (the request is not
in any forward pass yet) and the room becomes Success: SGLang starts
decoding. In one-stream modes that is the whole KV. In ``lynx`` mode the
residual keeps streaming in; once it has landed the room is marked
`landed` and the scheduler thread (`lynx_patches.speculate`) upgrades the
slots between forward passes, never this thread.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field

import numpy as np
import torch
from sglang.srt.disaggregation.base.conn import KVPoll

from lynx.kvwire import KVShape
from lynx.manifest import MANIFEST_TAG, Manifest
from lynx.transfer.frames import AUX_STREAM, FrameError, decode_frame, peek_room, verify
from lynx.transfer.reassembly import RequestAssembly
from lynx.transfer.zmq_transport import ZmqListener
from lynx_patches.pd.control import page_slots
from lynx_patches.pd.pool import layer_buffers, write_aux

logger = logging.getLogger(__name__)

FRAME_OVERHEAD = 4096


@dataclass
class Expected:
    """A request whose KV slots this rank reserved (from `send_metadata`).

    `residual` is ``"pending"`` until every stream has landed (then
    ``"landed"``), ``"none"`` in one-stream modes, or ``"failed"`` with
    `failure` set. `handed_over` means SGLang committed the transfer and the
    scheduler-side controller now owns the entry.
    """

    pages: np.ndarray
    aux_index: int
    since: float
    bootstrap_addr: str = ""
    reserved_at: float = field(default_factory=time.monotonic)
    manifest: Manifest | None = None
    assembly: RequestAssembly | None = None
    timings: dict[str, float] = field(default_factory=dict)
    anchor_written: bool = False
    residual: str = "pending"
    failure: str | None = None
    handed_over: bool = False
    prefill_endpoints: tuple[str, ...] = ()


class DecodeSide:
    def __init__(self, mgr) -> None:
        self.mgr = mgr
        self.rooms: dict[int, Expected] = {}
        self._lock = threading.Lock()
        self.residual_event = threading.Event()
        self.listener = ZmqListener(
            host=mgr.local_ip, max_message_bytes=mgr.config.chunk_bytes + FRAME_OVERHEAD
        )
        self._threads = [
            threading.Thread(target=self._data_loop, name="LynxDecodeData", daemon=True),
            threading.Thread(target=self._control_loop, name="LynxDecodeControl", daemon=True),
        ]

    @property
    def data_endpoint(self) -> str:
        return self.listener.endpoint

    def start(self) -> None:
        for thread in self._threads:
            thread.start()
        logger.info("Lynx decode: receiving KV on %s", self.data_endpoint)

    def close(self) -> None:
        self.listener.close()

    # --- request lifecycle (scheduler thread) ---------------------------------------------

    def expect(
        self, room: int, pages, aux_index: int, since: float, bootstrap_addr: str, prefill_endpoints=()
    ) -> None:
        """Accept KV for `room` into `pages`; `since` is when the request arrived (monotonic).

        `prefill_endpoints` (``tcp://ip:port`` of the prefill ranks' control
        sockets) are told to stop sending if the request ends before its residual.
        """
        entry = Expected(np.asarray(pages, dtype=np.int64), aux_index, since, bootstrap_addr)
        entry.prefill_endpoints = tuple(prefill_endpoints)
        with self._lock:
            self.rooms[room] = entry

    def hand_over(self, room: int) -> Expected | None:
        """SGLang committed the room's transfer: keep its entry past the receiver's end."""
        entry = self.rooms.get(room)
        if entry is not None:
            entry.handed_over = True
        return entry

    def release(self, room: int) -> None:
        """The receiver is done with `room`; drop it unless the controller owns it."""
        with self._lock:
            entry = self.rooms.get(room)
            if entry is not None and not entry.handed_over:
                del self.rooms[room]

    def forget(self, room: int) -> None:
        """Drop `room`; if its residual is still coming, ask the prefill to stop sending it."""
        from sglang.srt.disaggregation.common.conn import AbortNotification

        with self._lock:
            entry = self.rooms.pop(room, None)
        if entry is None or entry.residual != "pending":
            return
        parts = AbortNotification(room=room, decode_ip=self.mgr.local_ip, decode_port=self.mgr.rank_port).to_zmq()
        for endpoint in entry.prefill_endpoints:
            try:
                self.mgr._send_multipart_locked(endpoint, parts)
            except Exception as exc:  # the prefill may be gone; nothing else to do
                logger.debug("Lynx decode: could not cancel room %s at %s: %s", room, endpoint, exc)

    def fail_rooms_of(self, bootstrap_addr: str, reason: str) -> None:
        """The prefill at `bootstrap_addr` is gone: fail the residuals still expected from it."""
        with self._lock:
            entries = [(r, e) for r, e in self.rooms.items() if e.bootstrap_addr == bootstrap_addr]
        for room, entry in entries:
            if entry.residual == "pending":
                self._fail(room, reason)

    def take_residual(self, room: int) -> tuple[Manifest, list[torch.Tensor]] | None:
        """The full streams of a landed residual (once), for the scheduler thread to apply."""
        with self._lock:
            entry = self.rooms.get(room)
            if entry is None or entry.residual != "landed" or entry.assembly is None:
                return None
            streams = [_tensor(entry.assembly.buffer(s)) for s in range(len(entry.manifest.stream_sizes))]
            entry.assembly = None
            entry.residual = "applied"
            return entry.manifest, streams

    def waited(self, room: int) -> float | None:
        """Seconds since the room's slots were reserved, if it is still expected."""
        entry = self.rooms.get(room)
        return None if entry is None else time.monotonic() - entry.reserved_at

    def timings(self, room: int) -> dict[str, float]:
        """Seconds from the request's arrival to its transfer milestones (so far)."""
        entry = self.rooms.get(room)
        return {} if entry is None else {k: round(v, 6) for k, v in entry.timings.items()}


    # --- threads ---------------------------------------------------------------------------

    def _control_loop(self) -> None:
        recv = self.mgr._make_worker_recv(self.mgr.server_socket)
        while not self.mgr._stopped:
            msg = recv()
            if not msg or self.mgr.handle_abort_ack_message(msg):
                continue
            parsed = self.mgr.parse_kv_status_message(msg)
            if parsed is None:
                continue
            room, status, prefill_rank, reason = parsed
            if status == KVPoll.Failed:
                self.mgr.apply_prefill_status(
                    bootstrap_room=room, status=status, prefill_rank=prefill_rank, failure_reason=reason
                )

    def _data_loop(self) -> None:
        while not self.mgr._stopped:
            msg = self.listener.recv(timeout_s=0.5)
            if not msg:
                continue
            try:
                if msg[0] == MANIFEST_TAG:
                    self._on_manifest(msg)
                else:
                    self._on_frame(msg)
            except Exception:
                logger.exception("Lynx decode: data message failed")

    def _fail(self, room: int, reason: str) -> None:
        logger.error("Lynx decode: room %s failed: %s", room, reason)
        with self._lock:
            entry = self.rooms.get(room)
            if entry is not None and entry.handed_over:
                entry.residual, entry.failure, entry.assembly = "failed", reason, None
                self.residual_event.set()
                return
            self.rooms.pop(room, None)
        if room in self.mgr.request_status:
            self.mgr.record_failure(room, reason)
            self.mgr.update_status(room, KVPoll.Failed)

    def _on_manifest(self, msg: list[bytes]) -> None:
        if len(msg) != 3 or not verify(self.mgr.key, msg[2], MANIFEST_TAG, msg[1]):
            logger.error("Lynx decode: rejected a manifest with a bad signature (wrong secret?)")
            return
        manifest = Manifest.from_bytes(msg[1])
        entry = self.rooms.get(manifest.room)
        if entry is None:
            logger.error("Lynx decode: manifest for room %s, which this rank did not reserve", manifest.room)
            return
        self.mgr.pool_ready.wait()
        k_buffers, _ = layer_buffers(self.mgr.pool)
        capacity = len(entry.pages) * self.mgr.kv_args.page_size
        expected = KVShape(len(k_buffers), capacity, k_buffers[0].shape[1], k_buffers[0].shape[2], k_buffers[0].dtype)
        problem = manifest.mismatch(self.mgr.wire, expected, self.mgr.config.preset)
        if problem is None and manifest.aux_size != sum(self.mgr.kv_args.aux_item_lens):
            problem = f"aux of {manifest.aux_size} bytes, this server's metadata rows are different"
        if problem is not None:
            self._fail(manifest.room, problem)
            return
        sizes = {i: size for i, size in enumerate(manifest.stream_sizes)}
        sizes[AUX_STREAM] = manifest.aux_size
        entry.manifest = manifest
        entry.assembly = RequestAssembly(manifest.room, sizes)
        entry.timings["manifest_s"] = time.monotonic() - entry.since
        entry.timings["transferred_tokens"] = manifest.num_tokens

    def _on_frame(self, msg: list[bytes]) -> None:
        try:
            header, payload = decode_frame(msg, self.mgr.key, max_payload=self.mgr.config.chunk_bytes)
        except FrameError as exc:
            room = peek_room(msg)
            if room is not None and room in self.rooms:
                self._fail(room, f"rejected frame: {exc}")
            else:
                logger.error("Lynx decode: rejected frame: %s", exc)
            return
        entry = self.rooms.get(header.room)
        if entry is None or entry.assembly is None:
            # Late frames of a request that already ended (its sender is told to stop).
            logger.debug("Lynx decode: dropped a frame for room %s, which is not receiving", header.room)
            return
        try:
            completed = entry.assembly.accept(header, payload)
        except FrameError as exc:
            self._fail(header.room, f"rejected frame: {exc}")
            return
        if not completed:
            return
        elapsed = time.monotonic() - entry.since
        num_streams = len(entry.manifest.stream_sizes)
        if not entry.anchor_written and self._landed(entry, (AUX_STREAM, 0)):
            entry.timings["anchor_ready_s"] = elapsed
            self._land_anchor(header.room, entry)
        if entry.residual == "pending" and self._landed(entry, range(num_streams)):
            entry.timings["residual_ready_s"] = elapsed
            entry.residual = "landed"
            self.residual_event.set()

    @staticmethod
    def _landed(entry: Expected, streams) -> bool:
        return all(entry.assembly.is_complete(s) for s in streams)

    def _land_anchor(self, room: int, entry: Expected) -> None:
        """Write the anchor's values and the metadata into this rank's buffers; report Success."""
        manifest, assembly = entry.manifest, entry.assembly
        k_buffers, v_buffers = layer_buffers(self.mgr.pool)
        slots = page_slots(entry.pages, self.mgr.kv_args.page_size, manifest.num_tokens)
        index = torch.from_numpy(slots).to(k_buffers[0].device)
        anchor = _tensor(assembly.buffer(0))
        self.mgr.wire.write([anchor], manifest.shape, k_buffers, v_buffers, index)
        write_aux(self.mgr.kv_args, entry.aux_index, assembly.buffer(AUX_STREAM))
        entry.anchor_written = True
        if len(manifest.stream_sizes) == 1:
            entry.residual, entry.assembly = "none", None
            entry.timings.setdefault("residual_ready_s", entry.timings["anchor_ready_s"])
        self.mgr.update_status(room, KVPoll.Success)


def _tensor(buffer) -> torch.Tensor:
    """A uint8 tensor over a received stream buffer (torch.frombuffer refuses empty ones)."""
    view = memoryview(buffer).cast("B")
    return torch.frombuffer(view, dtype=torch.uint8) if len(view) else torch.empty(0, dtype=torch.uint8)
