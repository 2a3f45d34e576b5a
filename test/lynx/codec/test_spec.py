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
        ({"stage_bits": (4,), "sink_tokens": -1}, "sink_tokens"),
        ({"stage_bits": (4,), "sink_tokens": 2.0}, "sink_tokens"),
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


def test_presets_have_documented_stage_bits_and_four_sink_tokens():
    assert CodecSpec.preset_names()[0] == "int8"
    assert CodecSpec.preset("int8") == CodecSpec(stage_bits=(4, 4))
    assert all(CodecSpec.preset(name).sink_tokens == 4 for name in CodecSpec.preset_names())
    assert CodecSpec.preset("int16").stage_bits == (4, 12)
    assert CodecSpec.preset("int4").num_stages == 1
    exact = CodecSpec.preset("bf16-exact")
    assert exact.raw_residual and exact.stage_bits == (4,) and exact.num_stages == 2


def test_unknown_preset_lists_valid_names():
    with pytest.raises(ValueError, match="int8, int16, int4, bf16-exact"):
        CodecSpec.preset("int3")


def test_stream_bytes_counts_every_section():
    spec = CodecSpec(stage_bits=(3, 5), key_group_tokens=4, value_group_channels=8, sink_tokens=2)
    tokens, heads, head_dim = 11, 2, 16
    key_groups, value_groups, elements = 3, 2, 9 * 2 * 16
    anchor = 2 * (2 * heads * head_dim * 2)
    anchor += 2 * (key_groups * heads * head_dim * 2) + 2 * (9 * heads * value_groups * 2)
    anchor += 2 * ((elements * 3 + 7) // 8)
    assert spec.stream_bytes(tokens, heads, head_dim) == (anchor, 2 * ((elements * 5 + 7) // 8))


def test_requests_within_the_sink_tokens_have_empty_residual_streams():
    spec = CodecSpec(stage_bits=(4, 4), sink_tokens=4)
    assert spec.stream_bytes(3, 2, 64, torch.float32) == (2 * 3 * 2 * 64 * 4, 0)
    assert CodecSpec.preset("bf16-exact").stream_bytes(4, 2, 64) == (2 * 4 * 2 * 64 * 2, 0)


@pytest.mark.parametrize("dtype,itemsize", [(torch.float16, 2), (torch.bfloat16, 2), (torch.float32, 4)])
def test_raw_residual_size_follows_input_dtype(dtype, itemsize):
    spec = CodecSpec.preset("bf16-exact")
    assert spec.stream_bytes(9, 3, 64, dtype)[1] == 2 * 5 * 3 * 64 * itemsize
    assert spec.bytes_per_token(3, 64, dtype)[1] == 2 * 3 * 64 * itemsize


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_stream_bytes_are_raw_sinks_plus_bytes_per_token_over_whole_key_groups(dtype):
    for name in CodecSpec.preset_names():
        spec = CodecSpec.preset(name)
        tokens = spec.sink_tokens + 4 * spec.key_group_tokens
        raw_sinks = 2 * spec.sink_tokens * 3 * 64 * dtype.itemsize
        exact = spec.stream_bytes(tokens, 3, 64, dtype)
        rate = spec.bytes_per_token(3, 64, dtype)
        assert exact[0] == raw_sinks + 4 * spec.key_group_tokens * rate[0]
        assert exact[1:] == tuple(4 * spec.key_group_tokens * r for r in rate[1:])


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


def test_the_layout_reads_only_fields_a_codec_spec_has():
    from lynx.codec.layout import SpecFields

    assert isinstance(CodecSpec((2, 2)), SpecFields)
    assert not isinstance(object(), SpecFields)
