"""`LynxKVManager`: SGLang's common PD manager with Lynx's prioritized streams as data path.

SGLang's `CommonKVManager` keeps doing bootstrap, room status, heartbeats and
failure records. This class is the adapter between it and Lynx: it owns the
control thread on SGLang's control socket (signed registrations, metadata,
status and abort messages, `control`), and gives the side it builds
(`PrefillSide` or `DecodeSide`) only the narrow host interface that side
declares, never itself.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Optional

import zmq
from lynx.config import LynxConfig
from lynx.manifest import wire_version
from lynx.transfer.frames import seal
from lynx.transfer.supervise import Supervisor
from sglang.srt.disaggregation.base.conn import KVArgs, KVPoll
from sglang.srt.disaggregation.common.conn import (
    ABORT_TAG,
    AbortNotification,
    CommonKVManager,
    CommonKVReceiver,
)
from sglang.srt.disaggregation.utils import DisaggregationMode

from lynx.pd.control import (
    REGISTER_TAG,
    STATUS_TAG,
    ControlError,
    DecodeRegistration,
    RoomMetadata,
    open_sealed,
)
from lynx.pd.decode_side import DecodeSide
from lynx.pd.pool import PoolView
from lynx.pd.prefill_side import PrefillSide
from lynx_patches.pd.pool import check_pool, head_shard, layout_refusal
from lynx_patches.startup import lynx_config_of

logger = logging.getLogger(__name__)

CONTROL_POLL_MS = 500


class LynxKVManager(CommonKVManager):
    """One per scheduler rank and role; owns that rank's Lynx threads."""

    kv_status_msg_tag = STATUS_TAG
    kv_status_msg_carries_reason = True
    _status_listener: Callable[[], None] | None = None

    def __init__(self, args: KVArgs, disaggregation_mode, server_args, is_mla_backend=False):
        config: LynxConfig | None = lynx_config_of(server_args)
        if config is None:
            raise RuntimeError(
                "the lynx transfer backend needs --lynx on both the prefill and the decode server"
            )
        if is_mla_backend:
            raise RuntimeError(layout_refusal(["MLATokenToKVPool"], "an MLA attention backend"))
        self.config = config
        self.key = config.load_secret()
        super().__init__(args, disaggregation_mode, server_args, is_mla_backend)
        self.is_decode = disaggregation_mode == DisaggregationMode.DECODE
        if self.is_decode:
            self.side = DecodeSide(config, self.key, _DecodeHost(self), bind_host(server_args.host, self.local_ip))
            self._start_heartbeat_checker_thread()
        else:
            self.side = PrefillSide(config, self.key, _PrefillHost(self), self.local_ip)
        self.control = Supervisor(lambda name, error: None)
        self.control.start("LynxControl", self._control_loop)
        self.side.start()

    @property
    def session_id(self) -> str:
        return f"{self.local_ip}:{self.rank_port}"

    @property
    def broken(self) -> str | None:
        """Why this rank can no longer move KV (a Lynx thread keeps crashing), or None."""
        return self.control.broken or self.side.broken

    def notify_status_changes(self, listener: Callable[[], None]) -> None:
        """Call `listener()` after every room status change (the decode scheduler's idle wait)."""
        self._status_listener = listener

    def update_status(self, bootstrap_room: int, status: KVPoll) -> None:
        super().update_status(bootstrap_room, status)
        if self._status_listener is not None:
            self._status_listener()

    def fail_room(self, room: int, reason: str) -> None:
        """Record why the room failed and mark it Failed (SGLang reads the reason when it polls)."""
        self.record_failure(room, reason)
        self.update_status(room, KVPoll.Failed)

    def attach_pool(self, pool, model_config) -> None:
        """Give the side the rank's KV pool (its per-layer K/V tensors, which of the model's
        heads they hold) and metadata rows."""
        check_pool(pool)
        heads = head_shard(model_config, self.attn_tp_size, self.attn_tp_rank, pool)
        self.side.attach(PoolView.of(pool, self.kv_args, heads))

    # --- SGLang control messages, signed -------------------------------------------------

    def build_receiver_registration_message(self) -> list[bytes]:
        registration = DecodeRegistration(
            ip=self.local_ip,
            port=self.rank_port,
            session_id=self.session_id,
            tp_rank=self.kv_args.engine_rank,
            attn_tp_size=self.attn_tp_size,
            aux_item_lens=tuple(self.kv_args.aux_item_lens),
            wire_version=wire_version(),
            issued_ns=time.time_ns(),
            heads=self.side.pool.shard,
        )
        return seal(self.key, registration.to_parts())

    def build_receiver_metadata_message(
        self,
        *,
        bootstrap_room: int,
        required_dst_info_num: int,
        kv_indices,
        aux_index: Optional[int],
        state_indices,
        decode_prefix_len: Optional[int],
        is_dummy: bool,
        device_kv_indices=None,
    ) -> list[bytes]:
        reservation = self.side.reservation(bootstrap_room)
        if reservation is None and not is_dummy:
            raise ControlError(f"room {bootstrap_room} has no reservation on this decode rank")
        metadata = RoomMetadata(
            room=bootstrap_room,
            endpoint=self.local_ip,
            dst_port=self.rank_port,
            session_id=self.session_id,
            required_dst_info_num=required_dst_info_num,
            is_dummy=is_dummy,
            decode_prefix_len=int(decode_prefix_len or 0),
            num_tokens=0 if reservation is None else reservation.num_tokens,
            nonce=bytes(16) if reservation is None else reservation.nonce,
            data_endpoint=self.side.data_endpoint,
            draft_window_ms=round(self.side.draft_window_s * 1000),
        )
        return seal(self.key, metadata.to_parts())

    def _encode_kv_status_message(self, *, bootstrap_room, status, failure_reason) -> list[bytes]:
        parts = super()._encode_kv_status_message(
            bootstrap_room=bootstrap_room, status=status, failure_reason=failure_reason
        )
        return seal(self.key, parts)

    def parse_kv_status_message(self, msg: list[bytes]):
        if not msg or msg[0] != STATUS_TAG:
            return None
        try:
            return super().parse_kv_status_message(open_sealed(self.key, msg, "status message"))
        except ControlError as exc:
            logger.error("%s", exc)
            return None

    def _control_loop(self) -> None:
        poller = zmq.Poller()
        poller.register(self.server_socket, zmq.POLLIN)
        while not self.control.stop.is_set():
            msg = self.server_socket.recv_multipart() if poller.poll(CONTROL_POLL_MS) else None
            if msg and self.deferred_bootstrap is not None and self._handle_bootstrap_message(msg):
                continue
            if msg:
                try:
                    self._on_control(msg)
                except ControlError as exc:
                    logger.error("Lynx: %s", exc)

    def _on_control(self, msg: list[bytes]) -> None:
        if self.is_decode:
            if self.handle_abort_ack_message(msg):
                return
            parsed = self.parse_kv_status_message(msg)
            if parsed is not None and parsed[1] == KVPoll.Failed:
                room, _, _, reason = parsed
                self.side.on_prefill_failure(room, reason or "the prefill server failed the transfer")
            return
        if msg[0] == ABORT_TAG:
            notification = AbortNotification.from_zmq(msg)
            if notification is not None:
                self.side.on_abort(notification.room, "decode aborted the request")
        elif msg[0] == REGISTER_TAG:
            registration = DecodeRegistration.from_parts(open_sealed(self.key, msg, "registration"))
            self.side.on_registration(registration, tuple(self.kv_args.aux_item_lens))
        else:
            self.side.on_metadata(RoomMetadata.from_parts(open_sealed(self.key, msg, "room metadata")))

    # --- prefill data path -----------------------------------------------------------------

    def add_transfer_request(
        self,
        bootstrap_room: int,
        kv_indices,
        index_slice: slice,
        is_last_chunk: bool,
        aux_index: Optional[int] = None,
        state_indices=None,
        num_kv_tokens: Optional[int] = None,
        **_unused,
    ) -> None:
        if bootstrap_room not in self.request_status or self.check_status(bootstrap_room) == KVPoll.Failed:
            return
        self.side.add_chunk(bootstrap_room, kv_indices, is_last_chunk, aux_index, num_kv_tokens)

    def _handle_node_failure(self, failed_bootstrap_addr: str):
        super()._handle_node_failure(failed_bootstrap_addr)
        if self.is_decode:
            self.side.fail_peer(
                failed_bootstrap_addr,
                f"lost connection with prefill instance {failed_bootstrap_addr} before the "
                "request's KV arrived",
            )

    def teardown(self) -> None:
        self.control.close()
        self.side.close()


def bind_host(server_host: str | None, local_ip: str) -> str:
    """Where the data listener binds: the server's `--host` if it names one address, else `local_ip`."""
    if server_host and server_host not in ("0.0.0.0", "::", ""):
        return server_host
    return local_ip


class _PrefillHost:
    """`PrefillSide`'s view of SGLang: room status, failures, the decode prefix."""

    def __init__(self, mgr: LynxKVManager) -> None:
        self._mgr = mgr

    def room_ready(self, room: int, decode_prefix_len: int) -> None:
        # SGLang's prefill reads this when the request's sender starts (`pop_decode_prefix_len`).
        self._mgr.req_to_decode_prefix_len[room] = decode_prefix_len
        self._mgr.update_status(room, KVPoll.WaitingForInput)

    def succeed(self, room: int) -> None:
        self._mgr.update_status(room, KVPoll.Success)

    def fail(self, room: int, reason: str, notify=()) -> None:
        mgr = self._mgr
        if room in mgr.request_status and mgr.check_status(room) != KVPoll.Success:
            mgr.fail_room(room, reason)
        if notify:
            mgr.send_kv_status_message(
                targets=list(notify), bootstrap_room=room, status=KVPoll.Failed, failure_reason=reason
            )

    def failed(self, room: int) -> bool:
        return self._mgr.check_status(room) == KVPoll.Failed


class _DecodeHost:
    """`DecodeSide`'s view of SGLang: room status and asking prefill ranks to stop."""

    def __init__(self, mgr: LynxKVManager) -> None:
        self._mgr = mgr

    def succeed(self, room: int) -> None:
        self._mgr.update_status(room, KVPoll.Success)

    def fail(self, room: int, reason: str) -> None:
        if room in self._mgr.request_status:
            self._mgr.fail_room(room, reason)

    def transferring(self, room: int) -> None:
        # Out of SGLang's waiting timeout: the room's own no-progress deadline runs now.
        self._mgr.update_status(room, KVPoll.Transferring)

    def cancel(self, room: int, endpoints: tuple[str, ...]) -> None:
        """SGLang's abort notification to each prefill rank, on the socket its receivers send their own
        on (`CommonKVReceiver._connect`, one per rank, open since the room's metadata), not on a
        second one to the same rank."""
        mgr = self._mgr
        parts = AbortNotification(room=room, decode_ip=mgr.local_ip, decode_port=mgr.rank_port).to_zmq()
        for endpoint in endpoints:
            try:
                sock, lock = CommonKVReceiver._connect(endpoint, is_ipv6=endpoint.startswith("tcp://["))
                with lock:
                    sock.send_multipart(parts)
            except Exception as exc:  # the prefill may be gone; nothing else to do
                logger.debug("Lynx decode: could not cancel room %s at %s: %s", room, endpoint, exc)
