"""SGLang's sender/receiver/bootstrap classes for the lynx backend (thin over `common`).

Both refuse a second live request with the same bootstrap room without
touching the first one's state (SGLang keys its room tables by that id), and
both hold back a failure until no Lynx thread uses the request's KV pages, so
SGLang frees them only when nothing writes or reads them any more.
"""

from __future__ import annotations

import time

from lynx.pd.pool import page_slots
from lynx.transfer.rooms import DuplicateRoom
from sglang.srt.disaggregation.base.conn import KVPoll, KVTransferMetric
from sglang.srt.disaggregation.common.conn import (
    CommonKVBootstrapServer,
    CommonKVReceiver,
    CommonKVSender,
    KVTransferError,
)

DUPLICATE = (
    "bootstrap_room {room} is already used by a live request on this server; "
    "every request needs its own bootstrap_room"
)


class _ClaimsItsRoom:
    """A sender or receiver that lost the claim on its room to a live request fails with
    `DUPLICATE`, leaving that request's state in SGLang's room tables alone."""

    _lynx_owner: bool

    def failure_exception(self):
        if self._lynx_owner:
            return super().failure_exception()
        raise KVTransferError(self.bootstrap_room, DUPLICATE.format(room=self.bootstrap_room))


class LynxKVSender(_ClaimsItsRoom, CommonKVSender):
    """Prefill side per request; `lynx_side`, the manager's `PrefillSide`, does the sending."""

    def __init__(self, mgr, bootstrap_addr, bootstrap_room, *args, **kwargs):
        self.lynx_side = mgr.side
        self._wire_bytes: int | None = None
        self._lynx_owner = self.lynx_side.claim(bootstrap_room)
        super().__init__(mgr, bootstrap_addr, bootstrap_room, *args, **kwargs)
        if not self._lynx_owner:
            self.conclude_state = KVPoll.Failed
        elif mgr.broken is not None:
            mgr.fail_room(bootstrap_room, f"this prefill server cannot send KV: {mgr.broken}")

    def poll(self) -> KVPoll:
        status = super().poll()
        if status == KVPoll.Failed and self._lynx_owner and self.lynx_side.busy(self.bootstrap_room):
            return KVPoll.Transferring  # the encoder still reads the request's pages
        return status

    def abort(self) -> None:
        if self._lynx_owner:
            self.lynx_side.abort(self.bootstrap_room)
            super().abort()
            if not self.lynx_side.busy(self.bootstrap_room):
                # SGLang drops a request aborted in its waiting queue without `clear` (or a poll):
                # release here (a later `clear` releases nothing twice). A room the encoder is
                # reading stays until `clear`, which SGLang's failure path calls.
                self.lynx_side.release(self.bootstrap_room)

    def clear(self) -> None:
        if self._lynx_owner:
            self._wire_bytes = self.lynx_side.wire_bytes(self.bootstrap_room)
            self.lynx_side.release(self.bootstrap_room)
            super().clear()

    def get_transfer_metric(self) -> KVTransferMetric:
        """SGLang's transfer metric (`sglang:kv_transfer_*`) with the bytes this rank puts on the
        wire for the request, every stream and the metadata as encoded, where SGLang counts the
        pool's bytes of its tokens. SGLang reads it after `clear`; its latency stays the hand-off,
        from the first chunk to the pages freed (encoded and queued), not the link's time."""
        metric = super().get_transfer_metric()
        if self._wire_bytes is not None:
            metric.transfer_total_bytes = self._wire_bytes
        return metric


class LynxKVReceiver(_ClaimsItsRoom, CommonKVReceiver):
    """Decode side per request: reserves the room's slots in `lynx_side` (the manager's
    `DecodeSide`), fences failures, enforces the timeout."""

    def __init__(self, mgr, bootstrap_addr, bootstrap_room=None):
        self.created_at = time.monotonic()
        self.lynx_side = mgr.side
        self._lynx_owner = self.lynx_side.claim(bootstrap_room)
        super().__init__(mgr, bootstrap_addr, bootstrap_room)
        if not self._lynx_owner:
            self._owns_bootstrap_room = False  # SGLang's clear/abort then leave the room's state alone
            self.conclude_state = KVPoll.Failed
        elif mgr.broken is not None:
            self._fail(f"this decode server cannot receive KV: {mgr.broken}")

    def send_metadata(
        self, kv_indices, aux_index=None, state_indices=None, decode_prefix_len=None, lynx_num_tokens=None, **kwargs
    ):
        """Reserve the room for `lynx_num_tokens` tokens (passed by
        `lynx_patches.pd.registry.send_kv_metadata`; without it, every slot of the pages
        `kv_indices`), then send SGLang's metadata message."""
        if not self._lynx_owner or self.conclude_state == KVPoll.Failed:
            return
        from sglang.srt.utils.network import NetworkAddress

        mgr = self.kv_mgr
        page_size = mgr.kv_args.page_size
        tokens = lynx_num_tokens if lynx_num_tokens is not None else len(kv_indices) * page_size
        endpoints = [
            NetworkAddress(info["rank_ip"], int(info["rank_port"])).to_tcp()
            for info in (getattr(self, "bootstrap_infos", None) or [])
            if not info.get("is_dummy")
        ]
        try:
            slots = page_slots(kv_indices, page_size, tokens)
            room, since, peer = self.bootstrap_room, self.created_at, self.bootstrap_addr
            # One part per prefill rank holding some of this rank's heads (several when the
            # prefill runs more TP ranks than this server).
            self.lynx_side.reserve(room, slots, aux_index, since, peer, endpoints, sources=max(1, len(endpoints)))
        except (DuplicateRoom, ValueError) as exc:
            self._fail(str(exc))
            return
        super().send_metadata(kv_indices, aux_index, state_indices, decode_prefix_len, **kwargs)

    def poll(self) -> KVPoll:
        status = super().poll()
        if not self._lynx_owner:
            return status
        if status not in (KVPoll.Success, KVPoll.Failed):
            reason = self.lynx_side.check(self.bootstrap_room)
            if reason is not None:
                self._fail(reason)
                status = KVPoll.Failed
        if status == KVPoll.Failed:
            # Whoever failed the room, the prefill must stop sending its bytes, and
            # SGLang frees its slots next: no Lynx thread may write them any more.
            self.ensure_abort_notified()
            self.lynx_side.release(self.bootstrap_room)
        return status

    def _fail(self, reason: str) -> None:
        self.kv_mgr.fail_room(self.bootstrap_room, reason)

    def clear(self) -> None:
        if self._lynx_owner:
            self.lynx_side.release(self.bootstrap_room)
        super().clear()


class LynxKVBootstrapServer(CommonKVBootstrapServer):
    """SGLang's HTTP bootstrap server, unchanged."""
