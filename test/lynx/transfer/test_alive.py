"""The alive message: its exact wire bytes, its round trip, and every refusal (None, never an exception)."""

import hashlib
import struct

import pytest

from lynx.transfer.alive import ALIVE_TAG, ALIVE_VERSION, Alive, alive_room, encode_alive, open_alive
from lynx.transfer.frames import seal
from lynx.transfer.messages import MessageError, decode, encode

KEY = b"transfer-key"


def _control_mac(key: bytes, *fields: bytes) -> bytes:
    """The control MAC written out: keyed BLAKE2b-128 over length-prefixed fields."""
    digest = hashlib.blake2b(digest_size=16, key=key, person=b"lynx-control")
    for field in fields:
        digest.update(struct.pack("!Q", len(field)) + field)
    return digest.digest()


def test_an_alive_message_is_the_tag_the_packed_version_room_counter_and_their_mac_byte_for_byte():
    room, counter = 2**64 - 3, 2**63
    body = struct.pack("!BQQ", 2, room, counter)
    assert encode(Alive(room, counter)) == [b"LYNX_ALIVE", body]
    assert encode_alive(room, counter, KEY) == [b"LYNX_ALIVE", body, _control_mac(KEY, b"LYNX_ALIVE", body)]
    assert decode(Alive, [b"LYNX_ALIVE", body]) == Alive(room, counter, version=2)


def test_an_alive_message_round_trips_its_room_and_counter_under_its_key_and_version_only():
    parts = encode_alive(2**64 - 3, 2**63, KEY)
    assert alive_room(parts) == 2**64 - 3
    assert open_alive(parts, KEY) == 2**63
    assert open_alive(parts, b"other") is None
    other_version = encode(Alive(7, 1, version=ALIVE_VERSION + 1))
    assert alive_room(seal(KEY, other_version)) == 7, "another version's room is still readable"
    assert open_alive(seal(KEY, other_version), KEY) is None
    recounted = [parts[0], parts[1][:-1] + bytes([parts[1][-1] ^ 1]), parts[2]]
    assert open_alive(recounted, KEY) is None, "the counter is signed"


@pytest.mark.parametrize(
    "parts",
    [
        [ALIVE_TAG, struct.pack("!BQ", ALIVE_VERSION, 7)],  # no MAC
        [ALIVE_TAG, struct.pack("!BQ", ALIVE_VERSION, 7), b"m" * 16],  # the counterless format
        [ALIVE_TAG, struct.pack("!BQQ", ALIVE_VERSION, 7, 1) + b"\0", b"m" * 16],
        [b"LYNX_ALIVF", struct.pack("!BQQ", ALIVE_VERSION, 7, 1), b"m" * 16],
        [ALIVE_TAG, struct.pack("!BQQ", ALIVE_VERSION, 7, 1), b"m" * 16, b""],
        [],
    ],
)
def test_what_is_not_an_alive_message_names_no_room_and_opens_to_none(parts):
    assert alive_room(parts) is None
    assert open_alive(parts, KEY) is None


def test_a_message_the_wire_cannot_carry_is_refused_on_encode():
    with pytest.raises(MessageError, match="room"):
        encode(Alive(2**64, 0))
