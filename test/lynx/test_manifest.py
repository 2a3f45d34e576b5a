import pytest
import torch

from lynx.kvwire import KVShape, WireFormat
from lynx.manifest import Manifest, dtype_name

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


def test_more_tokens_than_reserved_is_refused():
    small = KVShape(2, 50, 3, 64, torch.bfloat16)
    assert "reserved" in _manifest().mismatch(WireFormat.for_mode("lynx", "int8"), small, "int8")


def test_inconsistent_stream_sizes_are_refused():
    bad = _manifest(stream_sizes=(1, 2))
    assert "stream sizes" in bad.mismatch(WireFormat.for_mode("lynx", "int8"), SHAPE, "int8")


@pytest.mark.parametrize("data", [b"{}", b"not json", b'{"version": 9}'])
def test_malformed_manifest_raises_value_error(data):
    with pytest.raises(ValueError):
        Manifest.from_bytes(data)


def test_dtype_names():
    assert dtype_name(torch.float16) == "float16"
    with pytest.raises(ValueError):
        dtype_name(torch.int8)
