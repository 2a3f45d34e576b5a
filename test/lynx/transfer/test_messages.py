"""The one message codec: every Lynx message round-trips with the bytes it always had, and bad input is refused."""

from dataclasses import dataclass

import pytest
import torch

from lynx.heads import HeadShard
from lynx.manifest import Envelope, Manifest, ManifestError, wire_version
from lynx.kvwire import KVShape, WireFormat
from lynx.pd.control import DecodeRegistration, RoomMetadata
from lynx.transfer.messages import (
    Body,
    Const,
    Decimal,
    Decimals,
    Family,
    Flag,
    Json,
    MessageError,
    Packed,
    Parts,
    Raw,
    Text,
    decode,
    encode,
    message,
)
from lynx.transfer.mooncake.control import (
    NO_SLOT,
    Auth,
    Challenge,
    Grant,
    Hello,
    Notify,
    Ping,
    Release,
    Reset,
    Want,
)

REGISTRATION = DecodeRegistration("127.0.0.1", 5000, "127.0.0.1:5000", 1, 2, (64, 8, 4), "manifest v5", 123,
                                  HeadShard(2, 1, 2, 3))
METADATA = RoomMetadata(42, "127.0.0.1", 5000, "s", 1, False, 96, 300, bytes(range(16)), "tcp://127.0.0.1:6000", 1875)
MANIFEST = Manifest(5, "lynx", "int8", 2, 100, 3, 64, "bfloat16", (10, 20), 128, 64, 1)

# What each message put on the wire before the codec existed: peers of earlier releases still agree.
WIRE = [
    (REGISTRATION, [b"None", b"127.0.0.1", b"5000", b"127.0.0.1:5000", b"1", b"2", b"64,8,4", b"manifest v5", b"123",
                    b"2,1,2,3,0"]),
    (METADATA, [b"42", b"5000", b"1", b"96", b"300", b"1875", b"127.0.0.1", b"s", b"0", bytes(range(16)),
                b"tcp://127.0.0.1:6000"]),
    (Hello(b"n" * 16), [b"H", b"n" * 16, b"\x02"]),
    (Challenge(b"n" * 16, b"t" * 16), [b"C", b"n" * 16, b"t" * 16]),
    (Auth(b"t" * 16), [b"A", b"t" * 16]),
    (Grant(3, (0, 5, 7), b"t" * 16), [b"G", bytes.fromhex("0000000000000003" "0003" "00000000" "00000005" "00000007"),
                                      b"t" * 16]),
    (Notify(9, 2, (38, 50_000, 12), (b"h" * 38, b"x" * 12), b"t" * 16),
     [b"N", bytes.fromhex("0000000000000009" "00000002" "0003" "00000026" "0000c350" "0000000c"), b"h" * 38, b"x" * 12,
      b"t" * 16]),
    (Release(10, (4, 0), b"t" * 16), [b"L", bytes.fromhex("000000000000000a" "0002" "00000004" "00000000"), b"t" * 16]),
    (Want(11, b"t" * 16), [b"W", bytes.fromhex("000000000000000b"), b"t" * 16]),
    (Reset("gone"), [b"R", b"gone"]),
    (Ping(), [b"P"]),
    (Envelope(5, b"{}"), [b"LYNX_MANIFEST", bytes.fromhex("0000000000000005"), b"{}"]),
    (MANIFEST, [b'{"aux_size": 128, "dtype": "bfloat16", "first_head": 1, "format_version": 2, "head_dim": 64, '
                b'"kv_heads": 3, "mode": "lynx", "num_layers": 2, "num_tokens": 100, "preset": "int8", "room": 5, '
                b'"segment_tokens": 64, "stream_sizes": [10, 20], "version": 5}']),
]


@pytest.mark.parametrize("msg,parts", WIRE, ids=[type(m).__name__ + str(i) for i, (m, _) in enumerate(WIRE)])
def test_every_message_type_encodes_to_its_old_bytes_and_decodes_back(msg, parts):
    assert encode(msg) == parts
    assert decode(type(msg), parts) == msg


@message(Const(b"T"), Text("name", max_bytes=8), Decimal("count", lo=1, hi=99), Flag("on"), Raw("nonce", 4),
         Decimals("sizes", max_count=3), Packed("I", "slot", array="items", min_items=1, max_items=2),
         Body("body", max_bytes=6), Parts("rest", 2, 5))
@dataclass(frozen=True)
class Sample:
    name: str
    count: int
    on: bool
    nonce: bytes
    sizes: tuple[int, ...]
    slot: int
    items: tuple[int, ...]
    body: bytes
    rest: tuple[bytes, ...]


SAMPLE = Sample("ab", 7, True, b"wxyz", (1, 2), 9, (3,), b"{}", (b"r",))


def _sample_parts(**changes) -> list[bytes]:
    order = ["kind", "name", "count", "on", "nonce", "sizes", "slot", "body"]
    parts = dict(zip(order, encode(SAMPLE)))
    parts.update(changes)
    return [parts[name] for name in order] + [b"r"]


def test_a_message_with_every_kind_of_part_round_trips_including_empty_and_longest_runs():
    for sample in (SAMPLE, Sample("", 1, False, b"\0" * 4, (), 0, (1, 2), b"", ()),
                   Sample("é", 99, True, b"1234", (5, 6, 7), (1 << 32) - 1, (0,), b"x" * 6, (b"", b"x" * 5))):
        assert decode(Sample, encode(sample)) == sample


@pytest.mark.parametrize("parts,field", [
    (_sample_parts()[:-2], "parts"),  # truncated: too few parts
    (_sample_parts(slot=b"\0\0\0\x09\0"), "slot"),  # truncated packed header
    (_sample_parts(slot=b"\0\0\0\x09\0\x01\0\0"), "slot"),  # the array shorter than its count
    (_sample_parts(slot=b"\0\0\0\x09\0\0"), "slot"),  # fewer items than allowed
    (_sample_parts(nonce=b"abc"), "nonce"),
    (_sample_parts(name=b"123456789"), "name"),  # oversized text
    (_sample_parts(name=b"\xff"), "name"),  # not UTF-8
    (_sample_parts(sizes=b"1,2,3,4"), "sizes"),  # more ints than allowed
    (_sample_parts(count=b"100"), "count"),  # out of range
    (_sample_parts(count=b"7.0"), "count"),  # wrongly typed
    (_sample_parts(count=b" 7"), "count"),
    (_sample_parts(sizes=b"1,,2"), "sizes"),
    (_sample_parts(sizes=b"-1"), "sizes"),
    (_sample_parts(on=b"yes"), "on"),
    (_sample_parts(body=b"x" * 7), "body"),  # a body over its bound
    (_sample_parts(kind=b"U"), "kind"),
    (_sample_parts() + [b"r", b"r"], "rest"),  # a run of parts longer than allowed
    (_sample_parts()[:-1] + [b"x" * 6], "rest"),  # one part of the run oversized
])
def test_truncated_oversized_and_wrongly_typed_parts_are_refused_naming_the_field(parts, field):
    with pytest.raises(MessageError, match=f"Sample: .*{field}"):
        decode(Sample, parts)


@pytest.mark.parametrize("changes,field", [
    (dict(name=b"ab"), "name"), (dict(count=True), "count"), (dict(on=1), "on"), (dict(nonce="wxyz"), "nonce"),
    (dict(sizes=[1, 2]), "sizes"), (dict(items=(1 << 32,)), "items"), (dict(rest=(b"a", "b")), "rest"), (dict(body="{}"), "body"),
])
def test_a_field_of_the_wrong_type_or_beyond_its_wire_form_cannot_be_encoded(changes, field):
    with pytest.raises(MessageError, match=field):
        encode(Sample(**{**SAMPLE.__dict__, **changes}))


def test_a_record_of_ints_and_flags_travels_as_one_part_and_is_checked_on_decode():
    assert decode(DecodeRegistration, encode(REGISTRATION)).heads == HeadShard(2, 1, 2, 3)
    for bad in (b"2,1,2,3", b"2,1,2,3,2", b"2,5,2,3,0", b"0,0,1,1,0"):  # too few, a flag of 2, rank >= size, no ranks
        with pytest.raises(MessageError, match="heads"):
            decode(DecodeRegistration, encode(REGISTRATION)[:-1] + [bad])


def test_unknown_kinds_and_empty_messages_are_refused_by_a_family():
    family = Family(Sample, Hello)
    assert family.decode(encode(SAMPLE)) == SAMPLE
    with pytest.raises(MessageError, match="unknown kind"):
        family.decode([b"Z", b"n" * 16])
    with pytest.raises(MessageError, match="empty"):
        family.decode([])
    with pytest.raises(TypeError):
        Family(Hello, Hello)


def test_a_version_other_than_ours_decodes_to_its_number_so_the_receiver_can_refuse_it_by_name():
    assert decode(Hello, [b"H", b"n" * 16, b"\x07"]).version == 7
    with pytest.raises(MessageError, match="version"):
        decode(Hello, [b"H", b"n" * 16, b"\x07\x00"])
    old = Manifest.from_bytes(encode(MANIFEST)[0].replace(b'"version": 5', b'"version": 4'))
    shape = KVShape(2, 100, 3, 64, torch.bfloat16)
    problem = old.mismatch(WireFormat.for_mode("lynx", "int8"), shape, "int8")
    assert "manifest v4" in problem and wire_version() in problem


def test_a_json_body_missing_a_defaulted_field_takes_the_default_and_an_unknown_field_is_refused():
    body = encode(MANIFEST)[0]
    assert Manifest.from_bytes(body.replace(b', "first_head": 1', b"")).first_head == 0
    with pytest.raises(ManifestError, match="unknown fields"):
        Manifest.from_bytes(body.replace(b'"room": 5', b'"room": 5, "extra": 1'))
    with pytest.raises(ManifestError, match="missing fields"):
        Manifest.from_bytes(body.replace(b'"room": 5, ', b""))


@message(Json(max_bytes=1 << 22, max_depth=2))
@dataclass(frozen=True)
class Deep:
    sizes: tuple[int, ...]


@pytest.mark.parametrize("body", [b"[" * 200_000 + b"]" * 200_000, b'{"sizes": [[1]]}', b'{"sizes": ' + b"{" * 99_999])
def test_json_nested_beyond_its_depth_is_refused_without_parsing_it(body):
    with pytest.raises(MessageError, match="nested"):
        decode(Deep, [body])


@pytest.mark.parametrize("body", [b"nope", b"[1]", b'{"sizes": [1, true]}', b'{"sizes": 1}', b'{"sizes": [1.0]}'])
def test_json_that_is_not_an_object_of_the_declared_types_is_refused(body):
    with pytest.raises(MessageError):
        decode(Deep, [body])
    assert decode(Deep, [b'{"sizes": [1, 2]}']) == Deep((1, 2))


def test_a_json_body_over_its_byte_bound_is_refused_before_it_is_read():
    with pytest.raises(ManifestError, match="4096"):
        Manifest.from_bytes(b" " * 5000)


def test_a_notification_whose_parts_disagree_is_refused_as_a_whole():
    with pytest.raises(MessageError, match="inline parts disagree"):
        decode(Notify, encode(Notify(0, 1, (50_000, 5), (b"toolong",), b"t" * 16)))
    with pytest.raises(MessageError, match="names a slot"):
        decode(Notify, encode(Notify(0, NO_SLOT, (50_000,), (), b"t" * 16)))


def test_a_reason_is_cut_to_its_bound_and_bad_bytes_in_it_are_replaced():
    assert encode(Reset("é" * 600))[1] == ("é" * 512).encode()
    assert decode(Reset, [b"R", b"bad \xff"]).reason == "bad \ufffd"


def test_a_message_type_must_carry_every_field_exactly_once():
    @dataclass(frozen=True)
    class Two:
        a: int
        b: int

    with pytest.raises(TypeError, match="carry"):
        message(Decimal("a"))(Two)
    with pytest.raises(TypeError, match="carry"):
        message(Decimal("a"), Decimal("a"), Decimal("b"))(Two)
    with pytest.raises(TypeError, match="not a message type"):
        encode(Two(1, 2))
