"""What `LynxKVManager` decides on its own: where a decode rank's data listener binds, and who
hears of a room's status change."""

from types import SimpleNamespace

import pytest
import zmq
from pd_fakes import SECRET, DecodeHost, config
from sglang.srt.disaggregation.base.conn import KVPoll
from sglang.srt.disaggregation.common.conn import AbortNotification, CommonKVReceiver

from lynx.pd.decode_side import DecodeSide
from lynx_patches.pd.manager import LynxKVManager, _DecodeHost, bind_host

LOCAL_IP = "10.0.0.7"


@pytest.mark.parametrize(
    "server_host, expected",
    [("127.0.0.1", "127.0.0.1"), ("0.0.0.0", LOCAL_IP), ("::", LOCAL_IP), ("", LOCAL_IP), (None, LOCAL_IP)],
)
def test_the_listener_binds_the_servers_host_when_it_names_one_address_else_the_ranks_ip(server_host, expected):
    assert bind_host(server_host, LOCAL_IP) == expected


def test_a_decode_side_bound_to_loopback_advertises_a_loopback_data_endpoint():
    side = DecodeSide(config(), SECRET, DecodeHost(), bind_host("127.0.0.1", LOCAL_IP))
    try:
        assert side.data_endpoint.startswith("tcp://127.0.0.1:")
        assert not side.data_endpoint.endswith(":0")
    finally:
        side.close()


def _room_table_only() -> LynxKVManager:
    """A manager with just the room table SGLang's `update_status` keeps (no sockets, no threads)."""
    manager = object.__new__(LynxKVManager)
    manager.request_status, manager.deferred_bootstrap = {}, None
    manager._deferred_ack_targets, manager._deferred_ack_poisoned_rooms, manager._staging_outstanding = {}, set(), {}
    return manager


def test_each_status_change_reaches_the_listener_after_sglang_recorded_it():
    manager = _room_table_only()
    manager.update_status(7, KVPoll.Bootstrapping)  # no listener yet
    seen = []
    manager.notify_status_changes(lambda: seen.append(dict(manager.request_status)))
    manager.update_status(7, KVPoll.WaitingForInput)
    manager.update_status(7, KVPoll.Failed)
    assert seen == [{7: KVPoll.WaitingForInput}, {7: KVPoll.Failed}]


def test_a_cancel_reaches_each_prefill_rank_on_the_socket_sglangs_receivers_send_their_aborts_on():
    """`_DecodeHost.cancel` over real ZeroMQ/TCP: the prefill rank's socket gets SGLang's abort
    notification for the room, and the decode opened no socket beside the receivers' one."""
    context = zmq.Context()
    prefill = context.socket(zmq.PULL)
    port = prefill.bind_to_random_port("tcp://127.0.0.1")
    endpoint = f"tcp://127.0.0.1:{port}"
    manager = SimpleNamespace(local_ip="127.0.0.1", rank_port=4242)
    try:
        _DecodeHost(manager).cancel(77, (endpoint,))
        assert prefill.poll(5000), "no abort notification reached the prefill rank"
        notification = AbortNotification.from_zmq(prefill.recv_multipart())
        assert (notification.room, notification.decode_port) == (77, 4242)
        assert endpoint in CommonKVReceiver._socket_cache, "sent on the receivers' socket to that rank"
    finally:
        CommonKVReceiver.disconnect_endpoint(endpoint)
        prefill.close(linger=0)
        context.term()
