import numpy as np
import pytest

from lynx.heads import HeadShard
from lynx.pd.control import (
    ControlError,
    DecodeRegistration,
    RoomMetadata,
    check_data_endpoint,
    open_sealed,
    seal,
)
from lynx.pd.pool import page_slots

KEY = b"k" * 32
NONCE = bytes(range(16))


def _metadata(**changes):
    fields = dict(
        room=42, endpoint="127.0.0.1", dst_port=5000, session_id="s", required_dst_info_num=1, is_dummy=False,
        decode_prefix_len=96, num_tokens=300, nonce=NONCE, data_endpoint="tcp://127.0.0.1:6000",
    )  # fmt: skip
    return RoomMetadata(**{**fields, **changes})


def test_registration_round_trips_through_a_sealed_message():
    heads = HeadShard(2, 1, 2, 3)
    reg = DecodeRegistration("127.0.0.1", 5000, "127.0.0.1:5000", 1, 2, (64, 8, 4), "manifest v2", 123, heads)
    assert DecodeRegistration.from_parts(open_sealed(KEY, seal(KEY, reg.to_parts()), "registration")) == reg


def test_room_metadata_round_trips_with_its_nonce_endpoint_and_draft_window():
    meta = _metadata(draft_window_ms=1875)
    assert RoomMetadata.from_parts(open_sealed(KEY, seal(KEY, meta.to_parts()), "metadata")) == meta


@pytest.mark.parametrize("tamper", ["wrong key", "flipped byte", "missing tag"])
def test_tampered_or_foreign_messages_are_rejected(tamper):
    parts = seal(KEY, _metadata().to_parts())
    key = KEY
    if tamper == "wrong key":
        key = b"x" * 32
    elif tamper == "flipped byte":
        parts[0] = b"2"
    else:
        parts = parts[:-1]
    with pytest.raises(ControlError, match="bad signature"):
        open_sealed(key, parts, "metadata")


@pytest.mark.parametrize(
    "parts",
    [[b"not-a-number"], _metadata(nonce=b"short").to_parts(), _metadata(num_tokens=-1).to_parts(),
     _metadata(draft_window_ms=-5).to_parts(), _metadata().to_parts()[:-1]],
)
def test_malformed_metadata_raises_control_error(parts):
    with pytest.raises(ControlError, match="malformed"):
        RoomMetadata.from_parts(parts)


@pytest.mark.parametrize(
    "endpoint",
    ["ipc:///tmp/x", "tcp://evil.example:80", "tcp://10.0.0.9:6000", "tcp://127.0.0.1:0", "tcp://127.0.0.1"],
)
def test_a_data_endpoint_off_the_decode_ranks_own_address_is_refused(endpoint):
    with pytest.raises(ControlError):
        check_data_endpoint(endpoint, "127.0.0.1")


def test_a_data_endpoint_on_the_decode_ranks_address_is_accepted():
    check_data_endpoint("tcp://127.0.0.1:6000", "127.0.0.1")
    check_data_endpoint("tcp://[::1]:6000", "::1")
    check_data_endpoint(_mooncake("127.0.0.1:7000", "tcp://127.0.0.1:7001"), "127.0.0.1")


@pytest.mark.parametrize("session,control", [("10.0.0.5:7000", "tcp://127.0.0.1:7001"), ("127.0.0.1:7000", "tcp://10.0.0.5:7001")])
def test_a_mooncake_endpoint_with_any_address_off_the_decode_rank_is_refused(session, control):
    with pytest.raises(ControlError, match="not on the sending decode rank"):
        check_data_endpoint(_mooncake(session, control), "127.0.0.1")


def _mooncake(session: str, control: str) -> str:
    from lynx.transfer.mooncake.control import MooncakeEndpoint

    return str(MooncakeEndpoint(session, "tcp", control, 0x7F0000, 16, 1 << 20))


def test_page_slots_expand_pages_and_cut_the_last_one():
    assert page_slots(np.array([2, 0]), 4, 6).tolist() == [8, 9, 10, 11, 0, 1]
    with pytest.raises(ValueError, match="do not fit"):
        page_slots(np.array([2]), 4, 5)
