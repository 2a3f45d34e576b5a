"""`LynxKVManager`: SGLang's common PD manager with Lynx's prioritized streams as data path.

SGLang's `CommonKVManager` keeps doing bootstrap, room status, heartbeats and
failure records. Lynx adds signed control messages (`control`), the prefill
side (`prefill_side`: encode, prioritize, send) and the decode side
(`decode_side`: reassemble, dequantize into the KV pool, report readiness).
"""

from __future__ import annotations

import logging
import threading
from typing import Optional

import numpy as np
from sglang.srt.disaggregation.base.conn import KVArgs, KVPoll
from sglang.srt.disaggregation.common.conn import CommonKVManager
from sglang.srt.disaggregation.utils import DisaggregationMode

from lynx.config import LynxConfig
from lynx_patches.pd.control import (
    STATUS_TAG,
    ControlError,
    DecodeRegistration,
    RoomMetadata,
    open_sealed,
    seal,
)

logger = logging.getLogger(__name__)


class LynxKVManager(CommonKVManager):
    """One per scheduler rank and role; owns that rank's Lynx threads."""

    kv_status_msg_tag = STATUS_TAG
    kv_status_msg_carries_reason = True

    def __init__(self, args: KVArgs, disaggregation_mode, server_args, is_mla_backend=False):
        config: LynxConfig | None = getattr(server_args, "_lynx", None)
        if config is None:
            raise RuntimeError(
                "the lynx transfer backend needs --lynx on both the prefill and the decode server"
            )
        if is_mla_backend:
            raise RuntimeError("the lynx transfer backend supports MHA KV caches only (not MLA)")
        self.config = config
        self.key = config.load_secret()
        self.wire = config.wire
        self._stopped = False
        self.pool = None
        self.pool_ready = threading.Event()
        super().__init__(args, disaggregation_mode, server_args, is_mla_backend)
        if disaggregation_mode == DisaggregationMode.PREFILL:
            from lynx_patches.pd.prefill_side import PrefillSide

            self.side = PrefillSide(self)
        else:
            from lynx_patches.pd.decode_side import DecodeSide

            self.side = DecodeSide(self)
            self._start_heartbeat_checker_thread()
        self.side.start()

    @property
    def session_id(self) -> str:
        return f"{self.local_ip}:{self.rank_port}"

    def attach_pool(self, pool) -> None:
        """Give the manager the rank's KV pool (its per-layer K/V tensors)."""
        from lynx_patches.pd.pool import check_pool

        check_pool(pool)
        self.pool = pool
        self.pool_ready.set()

    # --- SGLang control messages, signed -------------------------------------------------

    def build_receiver_registration_message(self) -> list[bytes]:
        registration = DecodeRegistration(
            ip=self.local_ip,
            port=self.rank_port,
            session_id=self.session_id,
            data_endpoint=self.side.data_endpoint,
            tp_rank=self.kv_args.engine_rank,
            attn_tp_size=self.attn_tp_size,
            aux_item_lens=tuple(self.kv_args.aux_item_lens),
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
        metadata = RoomMetadata(
            room=bootstrap_room,
            endpoint=self.local_ip,
            dst_port=self.rank_port,
            session_id=self.session_id,
            dst_pages=np.asarray(kv_indices if not is_dummy else [], dtype=np.int64),
            dst_aux_index=-1 if aux_index is None or is_dummy else int(aux_index),
            required_dst_info_num=required_dst_info_num,
            is_dummy=is_dummy,
            decode_prefix_len=int(decode_prefix_len or 0),
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
        if bootstrap_room not in self.request_status:
            return
        if self.check_status(bootstrap_room) == KVPoll.Failed:
            return
        self.side.add_chunk(bootstrap_room, kv_indices, is_last_chunk, aux_index, num_kv_tokens)

    def _handle_node_failure(self, failed_bootstrap_addr: str):
        super()._handle_node_failure(failed_bootstrap_addr)
        if self.disaggregation_mode == DisaggregationMode.DECODE:
            self.side.fail_rooms_of(
                failed_bootstrap_addr,
                f"lost connection with prefill instance {failed_bootstrap_addr} before the "
                "residual KV arrived",
            )

    def teardown(self) -> None:
        self._stopped = True
        self.side.close()
