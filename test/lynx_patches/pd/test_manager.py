"""What `LynxKVManager` decides on its own: where a decode rank's data listener binds."""

import pytest
from pd_fakes import SECRET, DecodeHost, config

from lynx.pd.decode_side import DecodeSide
from lynx_patches.pd.manager import bind_host

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
