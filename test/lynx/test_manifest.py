import struct

import pytest
import torch
from lynx.kvwire import KVShape, WireFormat
from lynx.manifest import (
    Manifest,
    ManifestError,
    dtype_name,
    manifest_room,
    open_manifest,
    wire_version,
)
from lynx.transfer import frames

SHAPE = KVShape(2, 100, 3, 64, torch.bfloat16)


def _manifest(mode="lynx", preset="int8", **changes):
    wire = WireFormat.for_mode(mode, preset)
    fields = dict(
        room=5, mode=mode, preset=preset, num_layers=2, num_tokens=100, kv_heads=3, head_dim=64,
        dtype="bfloat16", stream_sizes=wire.stream_sizes(SHAPE), aux_size=128,
    )  # fmt: skip
    return Manifest(**{**fields, **changes})


def test_round_trip_through_bytes():
    manifest = _manifest()
    assert Manifest.from_bytes(manifest.to_bytes()) == manifest
    assert manifest.shape == SHAPE


def test_matching_receiver_accepts():
    assert _manifest().mismatch(WireFormat.for_mode("lynx", "int8"), SHAPE, "int8") is None


@pytest.mark.parametrize(
    "receiver_mode,receiver_preset,message",
    [("int8", "int8", "--lynx-mode"), ("lynx", "int16", "--lynx-preset")],
)
def test_different_options_are_named(receiver_mode, receiver_preset, message):
    problem = _manifest().mismatch(WireFormat.for_mode(receiver_mode, receiver_preset), SHAPE, receiver_preset)
    assert problem is not None and message in problem


@pytest.mark.parametrize("reserved", [50, 101])
def test_a_token_count_other_than_the_reserved_one_is_refused(reserved):
    shape = KVShape(2, reserved, 3, 64, torch.bfloat16)
    problem = _manifest().mismatch(WireFormat.for_mode("lynx", "int8"), shape, "int8")
    assert problem == f"100 tokens announced, {reserved} slots reserved"


def test_another_wire_version_is_refused_naming_both_versions():
    problem = _manifest(format_version=1).mismatch(WireFormat.for_mode("lynx", "int8"), SHAPE, "int8")
    assert "codec format v1" in problem and wire_version() in problem


def test_sealed_manifest_opens_with_its_transfer_key_only():
    key, other = b"a" * 32, b"b" * 32
    parts = _manifest().seal(key)
    assert manifest_room(parts) == 5
    assert open_manifest(parts, key) == _manifest()
    with pytest.raises(ManifestError, match="bad MAC"):
        open_manifest(parts, other)
    swapped = [parts[0], (6).to_bytes(8, "big"), parts[2], parts[3]]
    with pytest.raises(ManifestError, match="bad MAC"):
        open_manifest(swapped, key)


def test_a_manifest_is_sealed_like_every_signed_message_and_its_mac_does_not_change():
    key = b"a" * 32
    parts = _manifest().seal(key)
    assert parts[:3] == [b"LYNX_MANIFEST", struct.pack("!Q", 5), _manifest().to_bytes()]
    assert parts == frames.seal(key, parts[:3])
    assert frames.unseal(key, parts) == parts[:3]
    assert parts[3] == frames.sign(key, *parts[:3])  # what earlier releases sent: peers still agree
    assert frames.unseal(b"b" * 32, parts) is None


@pytest.mark.parametrize(
    "field,value", [("num_tokens", "100"), ("stream_sizes", [1, "2"]), ("room", 1.5), ("mode", 3), ("aux_size", True)]
)
def test_wrongly_typed_fields_are_refused_at_once(field, value):
    import json

    body = json.loads(_manifest().to_bytes())
    body[field] = value
    with pytest.raises(ManifestError, match=field):
        Manifest.from_bytes(json.dumps(body).encode())


def test_inconsistent_stream_sizes_are_refused():
    bad = _manifest(stream_sizes=(1, 2))
    assert "stream sizes" in bad.mismatch(WireFormat.for_mode("lynx", "int8"), SHAPE, "int8")


@pytest.mark.parametrize("data", [b"{}", b"not json", b'{"version": 9}', b"[1, 2]"])
def test_malformed_manifest_raises_value_error(data):
    with pytest.raises(ValueError):
        Manifest.from_bytes(data)


def test_dtype_names():
    assert dtype_name(torch.float16) == "float16"
    with pytest.raises(ValueError):
        dtype_name(torch.int8)


@pytest.mark.parametrize("body", [b"[" * 2000 + b"]" * 2000, b'{"room": ' + b"{" * 1500 + b"}" * 1500 + b"}"])
def test_deeply_nested_json_is_refused_before_it_is_parsed(body):
    with pytest.raises(ManifestError, match="nested"):
        Manifest.from_bytes(body)


def test_brackets_inside_strings_do_not_count_as_nesting():
    import json

    from lynx.transfer.messages import json_depth

    body = json.loads(_manifest().to_bytes())
    body["preset"] = 'int8 [[[{{\\"[[['
    assert json_depth(json.dumps(body).encode()) == 2
    assert Manifest.from_bytes(json.dumps(body).encode()).preset == body["preset"]


def test_the_frame_count_covers_every_stream_of_every_segment_and_the_metadata():
    wire = WireFormat.for_mode("lynx", "int8")
    manifest = _manifest(segment_tokens=64)
    sizes = [size for segment in manifest.segment_sizes(wire) for size in segment]
    assert len(sizes) == 4  # two segments of two streams
    chunk = max(sizes) // 2 + 1
    assert manifest.frame_count(wire, chunk) == sum(1 if size <= chunk else 2 for size in sizes) + 1
    assert manifest.frame_count(wire, 1 << 30) == 5
