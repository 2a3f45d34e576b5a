"""Decode side of the lynx backend: receive streams, dequantize into the KV pool, report.

A data thread owns a `ZmqListener` (frame size bounded by `--lynx-chunk-bytes`).
Per request it expects a signed manifest, then frames that `RequestAssembly`
places into preallocated buffers; anything malformed, unauthenticated, out of
range or duplicated fails that request with the reason and writes nothing.
Only requests this rank reserved slots for are accepted, so a peer cannot make
it allocate memory or write outside the request's slots.

When every stream has landed, the KV is written into the request's slots
(the request is not in any forward pass yet) and the room becomes Success.
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
    """A request whose KV slots this rank reserved (from `send_metadata`)."""

    pages: np.ndarray
    aux_index: int
    reserved_at: float = field(default_factory=time.monotonic)
    manifest: Manifest | None = None
    assembly: RequestAssembly | None = None
    timings: dict[str, float] = field(default_factory=dict)


class DecodeSide:
    def __init__(self, mgr) -> None:
        self.mgr = mgr
        self.rooms: dict[int, Expected] = {}
        self._lock = threading.Lock()
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

    def expect(self, room: int, pages, aux_index: int) -> None:
        with self._lock:
            self.rooms[room] = Expected(np.asarray(pages, dtype=np.int64), aux_index)

    def forget(self, room: int) -> None:
        with self._lock:
            self.rooms.pop(room, None)

    def waited(self, room: int) -> float | None:
        """Seconds since the room's slots were reserved, if it is still expected."""
        entry = self.rooms.get(room)
        return None if entry is None else time.monotonic() - entry.reserved_at

    def timings(self, room: int) -> dict[str, float]:
        entry = self.rooms.get(room)
        return {} if entry is None else dict(entry.timings)

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
        entry.timings["manifest_s"] = time.monotonic() - entry.reserved_at

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
            logger.error("Lynx decode: frame for room %s without a reservation and manifest", header.room)
            return
        try:
            completed = entry.assembly.accept(header, payload)
        except FrameError as exc:
            self._fail(header.room, f"rejected frame: {exc}")
            return
        if completed and self._all_landed(entry):
            self._land(header.room, entry)

    def _all_landed(self, entry: Expected) -> bool:
        return all(entry.assembly.is_complete(s) for s in [AUX_STREAM, *range(len(entry.manifest.stream_sizes))])

    def _land(self, room: int, entry: Expected) -> None:
        """Write the request's KV and metadata into this rank's buffers, then report Success."""
        manifest, assembly = entry.manifest, entry.assembly
        k_buffers, v_buffers = layer_buffers(self.mgr.pool)
        slots = page_slots(entry.pages, self.mgr.kv_args.page_size, manifest.num_tokens)
        index = torch.from_numpy(slots).to(k_buffers[0].device)
        streams = [
            torch.frombuffer(assembly.buffer(s), dtype=torch.uint8)
            for s in range(len(manifest.stream_sizes))
        ]
        self.mgr.wire.write(streams, manifest.shape, k_buffers, v_buffers, index)
        write_aux(self.mgr.kv_args, entry.aux_index, assembly.buffer(AUX_STREAM))
        entry.timings["landed_s"] = time.monotonic() - entry.reserved_at
        entry.assembly = None
        self.mgr.update_status(room, KVPoll.Success)
