import numpy as np
import pytest

from lynx_patches.pd.control import (
    ControlError,
    DecodeRegistration,
    RoomMetadata,
    open_sealed,
    page_slots,
    seal,
)

KEY = b"k" * 32


def test_registration_round_trips_through_a_sealed_message():
    reg = DecodeRegistration("127.0.0.1", 5000, "127.0.0.1:5000", "tcp://127.0.0.1:6000", 0, 1, (64, 8, 4))
    assert DecodeRegistration.from_parts(open_sealed(KEY, seal(KEY, reg.to_parts()), "registration")) == reg


def test_room_metadata_round_trips_with_its_pages():
    meta = RoomMetadata(42, "127.0.0.1", 5000, "s", np.array([3, 9, 4]), 7, 1, False, decode_prefix_len=96)
    back = RoomMetadata.from_parts(open_sealed(KEY, seal(KEY, meta.to_parts()), "metadata"))
    assert back.room == 42 and back.dst_aux_index == 7 and back.dst_pages.tolist() == [3, 9, 4]
    assert back.decode_prefix_len == 96


@pytest.mark.parametrize("tamper", ["wrong key", "flipped byte", "missing tag"])
def test_tampered_or_foreign_messages_are_rejected(tamper):
    parts = seal(KEY, RoomMetadata(1, "h", 1, "s", np.array([1]), 0, 1, False).to_parts())
    key = KEY
    if tamper == "wrong key":
        key = b"x" * 32
    elif tamper == "flipped byte":
        parts[0] = b"2"
    else:
        parts = parts[:-1]
    with pytest.raises(ControlError, match="bad signature"):
        open_sealed(key, parts, "metadata")


def test_malformed_parts_raise_control_error():
    with pytest.raises(ControlError, match="malformed"):
        RoomMetadata.from_parts([b"not-a-number"])


def test_page_slots_expand_pages_and_cut_the_last_one():
    assert page_slots(np.array([2, 0]), 4, 6).tolist() == [8, 9, 10, 11, 0, 1]
    with pytest.raises(ValueError, match="do not fit"):
        page_slots(np.array([2]), 4, 5)
