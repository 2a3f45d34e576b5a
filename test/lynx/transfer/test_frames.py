"""Wire frames: exact round trips, and every kind of rejection."""

import hashlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lynx.transfer import frames
from lynx.transfer.frames import (
    AUX_STREAM,
    FRAME_VERSION,
    HEADER_BYTES,
    HEADER_STRUCT,
    FrameAuthError,
    FrameError,
    FrameHeader,
    MalformedFrame,
    OversizedFrame,
    UnsupportedVersion,
    decode_frame,
    encode_frame,
    peek_room,
    priority_of,
    sign,
    verify,
)

KEY = b"shared-secret"


def make_header(**overrides):
    fields = dict(room=7, stream=0, chunk_index=0, num_chunks=1, offset=0, length=4, layer_start=0, layer_end=1)
    fields.update(overrides)
    return FrameHeader(**fields)


def wire(parts):
    """What a receiver gets: plain bytes."""
    return [bytes(part) for part in parts]


@st.composite
def headers_and_payloads(draw):
    num_chunks = draw(st.integers(1, 2**32 - 1))
    payload = draw(st.binary(max_size=3000))
    layer_start = draw(st.integers(0, 2**16 - 1))
    header = FrameHeader(
        room=draw(st.integers(0, 2**64 - 1)),
        stream=draw(st.sampled_from([*range(16), AUX_STREAM])),
        chunk_index=draw(st.integers(0, num_chunks - 1)),
        num_chunks=num_chunks,
        offset=draw(st.integers(0, 2**64 - 1)),
        length=len(payload),
        layer_start=layer_start,
        layer_end=draw(st.integers(layer_start, 2**16 - 1)),
    )
    return header, payload


@settings(max_examples=200, deadline=None)
@given(case=headers_and_payloads(), key=st.sampled_from([b"", KEY, b"k" * 100]))
def test_decode_of_encode_returns_the_same_header_and_payload(case, key):
    header, payload = case
    parts = encode_frame(header, payload, key)
    assert len(parts[0]) == HEADER_BYTES
    decoded, view = decode_frame(wire(parts), key, max_payload=len(payload))
    assert decoded == header
    assert bytes(view) == payload


def test_encode_does_not_copy_the_payload():
    payload = bytearray(b"abcd")
    parts = encode_frame(make_header(), memoryview(payload), KEY)
    payload[0] = ord("z")
    assert bytes(parts[1]) == b"zbcd"


def test_corrupt_payload_byte_fails_authentication():
    parts = wire(encode_frame(make_header(), b"abcd", KEY))
    parts[1] = b"abce"
    with pytest.raises(FrameAuthError, match="corrupted.*different shared secret"):
        decode_frame(parts, KEY, max_payload=4)


@pytest.mark.parametrize("position", range(4, HEADER_BYTES))
def test_corrupt_header_byte_is_rejected(position):
    head = bytearray(encode_frame(make_header(), b"abcd", KEY)[0])
    head[position] ^= 0x01
    with pytest.raises(FrameError):
        decode_frame([bytes(head), b"abcd"], KEY, max_payload=1 << 20)


def test_wrong_key_fails_authentication():
    parts = wire(encode_frame(make_header(), b"abcd", KEY))
    with pytest.raises(FrameAuthError):
        decode_frame(parts, b"another-secret", max_payload=4)
    with pytest.raises(FrameAuthError):
        decode_frame(parts, b"", max_payload=4)


def test_bad_magic_is_malformed():
    head = bytearray(encode_frame(make_header(), b"abcd", KEY)[0])
    head[0:4] = b"LNYX"
    with pytest.raises(MalformedFrame, match="magic"):
        decode_frame([bytes(head), b"abcd"], KEY, max_payload=4)


def test_other_version_is_unsupported_before_any_size_check():
    head = bytearray(encode_frame(make_header(), b"abcd", KEY)[0])
    head[4] = FRAME_VERSION + 1
    with pytest.raises(UnsupportedVersion, match=f"version {FRAME_VERSION + 1}"):
        decode_frame([bytes(head[:20]), b"abcd"], KEY, max_payload=4)


def test_payload_over_the_limit_is_oversized():
    parts = wire(encode_frame(make_header(length=8), b"abcdefgh", KEY))
    with pytest.raises(OversizedFrame, match="more than the allowed 4"):
        decode_frame(parts, KEY, max_payload=4)


def test_payload_longer_or_shorter_than_declared_is_oversized():
    head = encode_frame(make_header(), b"abcd", KEY)[0]
    with pytest.raises(OversizedFrame):
        decode_frame([head, b"abcde"], KEY, max_payload=100)
    with pytest.raises(OversizedFrame):
        decode_frame([head, b"abc"], KEY, max_payload=100)


@pytest.mark.parametrize(
    "parts",
    [[], [b"LYNX"], [b"a", b"b", b"c"], [b"LY", b"abcd"], [b"", b""]],
    ids=["no-parts", "one-part", "three-parts", "short-magic", "empty-header"],
)
def test_truncated_or_misshapen_messages_are_malformed(parts):
    with pytest.raises(MalformedFrame):
        decode_frame(parts, KEY, max_payload=4)


def test_truncated_header_is_malformed():
    head = encode_frame(make_header(), b"abcd", KEY)[0]
    with pytest.raises(MalformedFrame, match="header has"):
        decode_frame([head[:-1], b"abcd"], KEY, max_payload=4)


def test_signed_header_with_chunk_index_past_num_chunks_is_malformed():
    header = make_header(num_chunks=2, chunk_index=1)
    head = bytearray(encode_frame(header, b"abcd", b"")[0])
    head[14:18] = (5).to_bytes(4, "big")
    fields = bytes(head[: HEADER_STRUCT.size])
    head[HEADER_STRUCT.size :] = hashlib.blake2b(fields + b"abcd", digest_size=16, person=b"lynx-frame").digest()
    with pytest.raises(MalformedFrame, match="chunk_index 5"):
        decode_frame([bytes(head), b"abcd"], b"", max_payload=4)


def test_junk_is_rejected_without_computing_a_mac(monkeypatch):
    macs = []
    real_mac = frames._frame_mac
    monkeypatch.setattr(frames, "_frame_mac", lambda *args: macs.append(1) or real_mac(*args))
    good = wire(encode_frame(make_header(num_chunks=2, chunk_index=1), b"abcd", KEY))
    macs.clear()
    other_version = bytearray(good[0])
    other_version[4] = 99
    past_the_end = bytearray(good[0])
    past_the_end[14:18] = (5).to_bytes(4, "big")
    junk = [
        [bytes(other_version), b"abcd"],
        [good[0], b"abcde"],
        [good[0], b"x" * (1 << 20)],
        [bytes(past_the_end), b"abcd"],
        [good[0][:-1], b"abcd"],
    ]
    for parts in junk:
        with pytest.raises(FrameError):
            decode_frame(parts, KEY, max_payload=4)
    assert macs == []
    decode_frame(good, KEY, max_payload=4)
    assert macs == [1]


def test_frame_errors_are_value_errors():
    assert issubclass(FrameError, ValueError)


@pytest.mark.parametrize(
    "overrides",
    [
        dict(stream=16),
        dict(stream=-1),
        dict(room=2**64),
        dict(num_chunks=0, chunk_index=0),
        dict(chunk_index=1, num_chunks=1),
        dict(layer_start=3, layer_end=2),
        dict(layer_end=2**16),
        dict(length=-1),
        dict(offset=True),
    ],
)
def test_header_fields_out_of_range_are_value_errors(overrides):
    with pytest.raises(ValueError):
        make_header(**overrides)


def test_encode_rejects_a_payload_that_disagrees_with_the_header():
    with pytest.raises(ValueError, match="header.length"):
        encode_frame(make_header(length=3), b"abcd", KEY)


def test_aux_and_anchor_share_the_first_priority_class():
    assert priority_of(AUX_STREAM) == priority_of(0) == 0
    assert [priority_of(stage) for stage in range(1, 16)] == list(range(1, 16))
    with pytest.raises(ValueError):
        priority_of(16)


def test_sign_verifies_only_the_same_fields_and_key():
    tag = sign(KEY, b"register", b"tcp://10.0.0.1:5000")
    assert len(tag) == 16
    assert verify(KEY, tag, b"register", b"tcp://10.0.0.1:5000")
    assert not verify(b"other", tag, b"register", b"tcp://10.0.0.1:5000")
    assert not verify(KEY, tag, b"register", b"tcp://10.0.0.1:5001")
    assert not verify(KEY, tag, b"registertcp://10.0.0.1:5000")
    assert not verify(KEY, tag[:-1] + bytes([tag[-1] ^ 1]), b"register", b"tcp://10.0.0.1:5000")


def test_control_tags_cannot_pass_as_frame_macs():
    header = make_header()
    head = encode_frame(header, b"abcd", KEY)[0]
    forged = head[: HEADER_STRUCT.size] + sign(KEY, head[: HEADER_STRUCT.size] + b"abcd")
    with pytest.raises(FrameAuthError):
        decode_frame([forged, b"abcd"], KEY, max_payload=4)


def test_peek_room_reads_the_unverified_room_of_rejected_frames():
    parts = wire(encode_frame(make_header(room=2**64 - 2), b"abcd", KEY))
    parts[1] = b"abce"
    with pytest.raises(FrameAuthError):
        decode_frame(parts, KEY, max_payload=4)
    assert peek_room(parts) == 2**64 - 2
    assert peek_room([parts[0][:13], b""]) == 2**64 - 2
    assert peek_room([parts[0][:12], b""]) is None
    assert peek_room([b"XXXX" + parts[0][4:], b""]) is None
    assert peek_room([]) is None


def test_the_segment_travels_in_the_signed_header():
    header = make_header(segment=513)
    decoded, _ = decode_frame(wire(encode_frame(header, b"abcd", KEY)), KEY, max_payload=4)
    assert decoded.segment == 513 and decoded == header
    with pytest.raises(ValueError, match="segment"):
        make_header(segment=1 << 16)

