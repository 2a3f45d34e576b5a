"""SGLang's sender/receiver/bootstrap classes for the lynx backend (thin over `common`)."""

from __future__ import annotations

import time

from sglang.srt.disaggregation.base.conn import KVPoll
from sglang.srt.disaggregation.common.conn import (
    CommonKVBootstrapServer,
    CommonKVReceiver,
    CommonKVSender,
)


class LynxKVSender(CommonKVSender):
    """Prefill side per request; the manager's `PrefillSide` does the sending."""

    def clear(self) -> None:
        self.kv_mgr.side.forget(self.bootstrap_room)
        super().clear()


class LynxKVReceiver(CommonKVReceiver):
    """Decode side per request: registers the reservation and enforces the transfer timeout."""

    def __init__(self, mgr, bootstrap_addr, bootstrap_room=None):
        self.created_at = time.monotonic()
        super().__init__(mgr, bootstrap_addr, bootstrap_room)

    def send_metadata(self, kv_indices, aux_index=None, state_indices=None, decode_prefix_len=None, **kwargs):
        from sglang.srt.utils.network import NetworkAddress

        endpoints = [
            NetworkAddress(info["rank_ip"], int(info["rank_port"])).to_tcp()
            for info in (getattr(self, "bootstrap_infos", None) or [])
            if not info.get("is_dummy")
        ]
        self.kv_mgr.side.expect(
            self.bootstrap_room,
            kv_indices,
            aux_index,
            since=self.created_at,
            bootstrap_addr=self.bootstrap_addr,
            prefill_endpoints=endpoints,
        )
        super().send_metadata(kv_indices, aux_index, state_indices, decode_prefix_len, **kwargs)

    def poll(self) -> KVPoll:
        status = super().poll()
        if status == KVPoll.Failed:
            # Whoever failed the room (a bad frame, a lost peer), the prefill
            # server must stop sending its bytes: they would hold up the link.
            self.ensure_abort_notified()
        if status in (KVPoll.Success, KVPoll.Failed):
            return status
        waited = self.kv_mgr.side.waited(self.bootstrap_room)
        timeout = self.kv_mgr.config.transfer_timeout
        if waited is not None and waited > timeout:
            self.abort()  # marks the room Failed and tells the prefill server
            self.kv_mgr.record_failure(
                self.bootstrap_room,
                f"KV of the request did not arrive within {timeout:g}s "
                "(--lynx-transfer-timeout); is the prefill server alive?",
            )
            return KVPoll.Failed
        return status

    def clear(self) -> None:
        self.kv_mgr.side.release(self.bootstrap_room)
        super().clear()


class LynxKVBootstrapServer(CommonKVBootstrapServer):
    """SGLang's HTTP bootstrap server, unchanged."""
