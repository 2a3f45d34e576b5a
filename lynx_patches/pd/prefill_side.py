"""Prefill side of the lynx backend: learn destinations, encode KV, send it by priority.

Threads: a control thread (decode registrations and per-request metadata on
SGLang's control socket) and an encoder thread. On a request's last chunk the
encoder snapshots its KV into the mode's streams (anchor first), announces
them with a signed manifest and hands them to the `PrioritySender`, whose
single link sends every queued anchor byte before any residual byte. The room
is reported Success once the snapshot is taken, so SGLang may free the
prefill KV pages: the residual no longer reads them.
"""

from __future__ import annotations

import logging
import queue
import threading
from dataclasses import dataclass

import numpy as np
import torch
from sglang.srt.disaggregation.base.conn import KVPoll
from sglang.srt.disaggregation.common.conn import ABORT_TAG, AbortNotification

from lynx.kvwire import KVShape
from lynx.manifest import MANIFEST_TAG, Manifest, dtype_name
from lynx.transfer.frames import AUX_STREAM, sign
from lynx.transfer.pacer import make_pacer
from lynx.transfer.sender import PrioritySender
from lynx.transfer.zmq_transport import ZmqTransport
from lynx_patches.pd.control import (
    REGISTER_TAG,
    ControlError,
    DecodeRegistration,
    RoomMetadata,
    open_sealed,
    page_slots,
)
from lynx_patches.pd.pool import layer_buffers, read_aux

logger = logging.getLogger(__name__)


@dataclass
class _Job:
    room: int
    pages: np.ndarray
    num_tokens: int
    aux_index: int


class PrefillSide:
    def __init__(self, mgr) -> None:
        self.mgr = mgr
        self.peers: dict[str, DecodeRegistration] = {}
        self._chunks: dict[int, list[tuple[np.ndarray, int]]] = {}
        self._jobs: queue.Queue[_Job | None] = queue.Queue()
        self.transport = ZmqTransport()
        self.sender = PrioritySender(
            self.transport,
            mgr.key,
            chunk_bytes=mgr.config.chunk_bytes,
            pacer=make_pacer(mgr.config.link_gbps, burst_bytes=mgr.config.chunk_bytes),
            on_error=self._on_send_error,
        )
        self._threads = [
            threading.Thread(target=self._control_loop, name="LynxPrefillControl", daemon=True),
            threading.Thread(target=self._encode_loop, name="LynxPrefillEncoder", daemon=True),
        ]

    def start(self) -> None:
        self.sender.start()
        for thread in self._threads:
            thread.start()

    def close(self) -> None:
        self._jobs.put(None)
        self.sender.close()
        self.transport.close()

    # --- control ---------------------------------------------------------------------------

    def _control_loop(self) -> None:
        recv = self.mgr._make_worker_recv(self.mgr.server_socket)
        while not self.mgr._stopped:
            msg = recv()
            if not msg:
                continue
            try:
                self._handle_control(msg)
            except ControlError as exc:
                logger.error("Lynx prefill: %s", exc)
            except Exception:
                logger.exception("Lynx prefill: control message failed")

    def _handle_control(self, msg: list[bytes]) -> None:
        if msg[0] == ABORT_TAG:
            notification = AbortNotification.from_zmq(msg)
            if notification is not None:
                self._abort(notification.room, "decode aborted the request")
            return
        if msg[0] == REGISTER_TAG:
            registration = DecodeRegistration.from_parts(open_sealed(self.mgr.key, msg, "registration"))
            self._register(registration)
            return
        metadata = RoomMetadata.from_parts(open_sealed(self.mgr.key, msg, "room metadata"))
        if metadata.session_id not in self.peers:
            raise ControlError(f"metadata for room {metadata.room} from unregistered {metadata.session_id}")
        infos = self.mgr.transfer_infos.setdefault(metadata.room, {})
        infos[metadata.session_id] = metadata
        if len(infos) == metadata.required_dst_info_num:
            # Send only what the decode rank lacks: SGLang's prefill reads this
            # when the request's sender starts (`pop_decode_prefix_len`).
            real = [i for i in infos.values() if not i.is_dummy]
            self.mgr.req_to_decode_prefix_len[metadata.room] = real[0].decode_prefix_len if real else 0
            self.mgr.update_status(metadata.room, KVPoll.WaitingForInput)

    def _register(self, registration: DecodeRegistration) -> None:
        mine = tuple(self.mgr.kv_args.aux_item_lens)
        if registration.attn_tp_size != self.mgr.attn_tp_size:
            raise ControlError(
                f"decode {registration.session_id} runs attention TP {registration.attn_tp_size}, "
                f"this prefill {self.mgr.attn_tp_size}; the lynx backend needs equal TP sizes"
            )
        if registration.aux_item_lens != mine:
            raise ControlError(
                f"decode {registration.session_id} has metadata buffers {registration.aux_item_lens}, "
                f"this prefill {mine}; start both with the same options"
            )
        self.peers[registration.session_id] = registration
        logger.info("Lynx prefill: decode %s registered (data %s)", registration.session_id, registration.data_endpoint)

    def _abort(self, room: int, reason: str) -> None:
        self.sender.cancel(room)
        self._chunks.pop(room, None)
        status = self.mgr.request_status.get(room)
        if status is not None and status != KVPoll.Success:
            self.mgr.record_failure(room, reason)
            self.mgr.update_status(room, KVPoll.Failed)

    def forget(self, room: int) -> None:
        """The request ended on this side: drop chunks of it still being collected."""
        self._chunks.pop(room, None)

    # --- data ------------------------------------------------------------------------------

    def add_chunk(self, room: int, pages, is_last: bool, aux_index, num_tokens) -> None:
        """Called by SGLang's sender for each prefilled chunk (scheduler thread)."""
        if room not in self.mgr.transfer_infos:
            return
        pages = np.asarray(pages, dtype=np.int64)
        count = len(pages) * self.mgr.kv_args.page_size if num_tokens is None else int(num_tokens)
        self._chunks.setdefault(room, []).append((pages, count))
        if is_last:
            chunks = self._chunks.pop(room)
            self._jobs.put(
                _Job(room, np.concatenate([p for p, _ in chunks]), sum(n for _, n in chunks), aux_index)
            )

    def _encode_loop(self) -> None:
        while (job := self._jobs.get()) is not None:
            try:
                self._send(job)
            except Exception as exc:
                logger.exception("Lynx prefill: sending room %s failed", job.room)
                self.mgr.conclude_failure(bootstrap_room=job.room, failure_reason=f"lynx prefill: {exc}")

    def _send(self, job: _Job) -> None:
        infos = [i for i in self.mgr.transfer_infos.get(job.room, {}).values() if not i.is_dummy]
        if self.mgr.check_status(job.room) == KVPoll.Failed or not infos:
            return
        self.mgr.pool_ready.wait()
        k_buffers, v_buffers = layer_buffers(self.mgr.pool)
        slots = page_slots(job.pages, self.mgr.kv_args.page_size, job.num_tokens)
        index = torch.from_numpy(slots).to(k_buffers[0].device)
        shape = KVShape(len(k_buffers), job.num_tokens, k_buffers[0].shape[1], k_buffers[0].shape[2], k_buffers[0].dtype)
        wire = self.mgr.wire
        streams = wire.encode(k_buffers, v_buffers, index)
        aux = read_aux(self.mgr.kv_args, job.aux_index)
        manifest = Manifest(
            room=job.room,
            mode=wire.mode,
            preset=self.mgr.config.preset,
            num_layers=shape.num_layers,
            num_tokens=shape.num_tokens,
            kv_heads=shape.kv_heads,
            head_dim=shape.head_dim,
            dtype=dtype_name(shape.dtype),
            stream_sizes=tuple(int(s.numel()) for s in streams),
            aux_size=len(aux),
        ).to_bytes()
        bounds = wire.layer_bounds(shape)
        for info in infos:
            endpoint = self.peers[info.session_id].data_endpoint
            self.transport.send(endpoint, [MANIFEST_TAG, manifest, sign(self.mgr.key, MANIFEST_TAG, manifest)])
            self.sender.submit(endpoint, job.room, AUX_STREAM, aux)
            for stream_id, (data, layer_bounds) in enumerate(zip(streams, bounds)):
                self.sender.submit(endpoint, job.room, stream_id, data.numpy(), layer_bounds)
        self.mgr.update_status(job.room, KVPoll.Success)

    def _on_send_error(self, room: int, message: str) -> None:
        logger.error("Lynx prefill: room %s: %s", room, message)
        if room in self.mgr.request_status and self.mgr.check_status(room) != KVPoll.Success:
            self.mgr.conclude_failure(bootstrap_room=room, failure_reason=message)
