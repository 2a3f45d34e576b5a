"""CodecSpec validation, presets and byte accounting."""

import dataclasses

import pytest
import torch

from lynx.codec import CodecSpec


@pytest.mark.parametrize(
    "kwargs,reason",
    [
        ({"stage_bits": ()}, "at least one stage"),
        ({"stage_bits": (4, 0)}, ">= 1"),
        ({"stage_bits": (-2, 4)}, ">= 1"),
        ({"stage_bits": (4, 2.0)}, ">= 1"),
        ({"stage_bits": (8, 8, 1)}, "exceed 16"),
        ({"stage_bits": 4}, "sequence"),
        ({"stage_bits": (4, 4), "raw_residual": True}, "exactly one quantized stage"),
        ({"stage_bits": (4,), "scale_dtype": "float32"}, "scale_dtype"),
        ({"stage_bits": (4,), "key_group_tokens": 0}, "key_group_tokens"),
        ({"stage_bits": (4,), "value_group_channels": -8}, "value_group_channels"),
        ({"stage_bits": (4,), "raw_residual": 1}, "raw_residual"),
    ],
)
def test_invalid_spec_raises_value_error_with_reason(kwargs, reason):
    with pytest.raises(ValueError, match=reason):
        CodecSpec(**kwargs)


def test_spec_is_frozen_and_normalizes_stage_bits_to_tuple():
    spec = CodecSpec(stage_bits=[2, 2, 4])
    assert spec.stage_bits == (2, 2, 4)
    assert (spec.total_bits, spec.anchor_bits, spec.num_stages) == (8, 2, 3)
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.stage_bits = (8,)


def test_presets_have_documented_stage_bits():
    assert CodecSpec.preset_names()[0] == "int8"
    assert CodecSpec.preset("int8") == CodecSpec(stage_bits=(4, 4))
    assert CodecSpec.preset("int16").stage_bits == (4, 12)
    assert CodecSpec.preset("int4").num_stages == 1
    exact = CodecSpec.preset("bf16-exact")
    assert exact.raw_residual and exact.stage_bits == (4,) and exact.num_stages == 2


def test_unknown_preset_lists_valid_names():
    with pytest.raises(ValueError, match="int8, int16, int4, bf16-exact"):
        CodecSpec.preset("int3")


def test_stream_bytes_counts_every_section():
    spec = CodecSpec(stage_bits=(3, 5), key_group_tokens=4, value_group_channels=8)
    tokens, heads, head_dim = 9, 2, 16
    key_groups, value_groups, elements = 3, 2, 9 * 2 * 16
    anchor = 2 * (key_groups * heads * head_dim * 2) + 2 * (tokens * heads * value_groups * 2)
    anchor += 2 * ((elements * 3 + 7) // 8)
    assert spec.stream_bytes(tokens, heads, head_dim) == (anchor, 2 * ((elements * 5 + 7) // 8))


@pytest.mark.parametrize("dtype,itemsize", [(torch.float16, 2), (torch.bfloat16, 2), (torch.float32, 4)])
def test_raw_residual_size_follows_input_dtype(dtype, itemsize):
    spec = CodecSpec.preset("bf16-exact")
    assert spec.stream_bytes(5, 3, 64, dtype)[1] == 2 * 5 * 3 * 64 * itemsize
    assert spec.bytes_per_token(3, 64, dtype)[1] == 2 * 3 * 64 * itemsize


def test_bytes_per_token_matches_stream_bytes_on_whole_groups():
    for name in CodecSpec.preset_names():
        spec = CodecSpec.preset(name)
        exact = spec.stream_bytes(4 * spec.key_group_tokens, 3, 64)
        assert tuple(size / (4 * spec.key_group_tokens) for size in exact) == spec.bytes_per_token(3, 64)


def test_int8_anchor_is_about_a_quarter_of_bf16_and_equals_int4():
    bf16_per_token = 2 * 3 * 64 * 2
    int8 = CodecSpec.preset("int8").bytes_per_token(3, 64)
    assert int8[0] <= 0.29 * bf16_per_token
    assert int8[0] == CodecSpec.preset("int4").bytes_per_token(3, 64)[0]
    assert CodecSpec.preset("int8").stream_bytes(130, 3, 64)[0] == CodecSpec.preset("int4").stream_bytes(130, 3, 64)[0]


def test_byte_accounting_rejects_indivisible_head_dim_and_bad_dtype():
    spec = CodecSpec.preset("int8")
    with pytest.raises(ValueError, match="multiple of value_group_channels"):
        spec.stream_bytes(10, 3, 96)
    with pytest.raises(ValueError, match="dtype"):
        spec.bytes_per_token(3, 64, torch.int8)
    with pytest.raises(ValueError, match="num_tokens"):
        spec.stream_bytes(0, 3, 64)
