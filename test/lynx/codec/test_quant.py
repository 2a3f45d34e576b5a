"""Group quantization: hierarchical error bounds, the anchor as plain rounding, grouping, validation."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lynx.codec import CodecSpec, dequantize_key, dequantize_value, quantize_key, quantize_value
from lynx.codec.rounding import round_down

DTYPES = [torch.float16, torch.bfloat16, torch.float32]


def _random(shape, dtype, seed, spread=1.0):
    generator = torch.Generator().manual_seed(seed)
    channel_scale = torch.rand(shape[1:], generator=generator) * 4 * spread + 0.01
    return (torch.randn(shape, generator=generator) * channel_scale).to(dtype)


def _per_element(spec, kind, param, tokens):
    if kind == "key":
        return param.double().repeat_interleave(spec.key_group_tokens, dim=0)[:tokens]
    return param.double().repeat_interleave(spec.value_group_channels, dim=2)


def _pair(kind):
    """(quantize, dequantize) for ``"key"`` or ``"value"``."""
    return (quantize_key, dequantize_key) if kind == "key" else (quantize_value, dequantize_value)


@settings(max_examples=40, deadline=None)
@given(
    stage_bits=st.lists(st.integers(1, 8), min_size=1, max_size=3).filter(lambda b: sum(b) <= 16).map(tuple),
    tokens=st.integers(1, 70),
    dtype=st.sampled_from(DTYPES),
    scale_dtype=st.sampled_from(["float16", "bfloat16"]),
    kind=st.sampled_from(["key", "value"]),
    seed=st.integers(0, 2**31 - 1),
)
def test_every_prefix_error_within_half_its_finest_step(stage_bits, tokens, dtype, scale_dtype, kind, seed):
    spec = CodecSpec(stage_bits=stage_bits, key_group_tokens=16, value_group_channels=8, scale_dtype=scale_dtype)
    x = _random((tokens, 2, 16), dtype, seed)
    quantize, dequantize = _pair(kind)
    codes, mn, scale = quantize(x, spec)
    assert len(codes) == len(stage_bits)
    for stage, width in zip(codes, stage_bits):
        assert stage.dtype == torch.int32 and stage.shape == x.shape
        assert int(stage.min()) >= 0 and int(stage.max()) < 1 << width
    scale_e = _per_element(spec, kind, scale, tokens)
    for count in range(1, len(stage_bits) + 1):
        rebuilt = dequantize(codes[:count], mn, scale, spec)
        assert rebuilt.dtype == torch.float32
        step = scale_e * 2.0 ** -sum(stage_bits[1:count])
        error = (rebuilt.double() - x.double()).abs()
        assert bool((error <= step / 2 + 1e-6 * (x.double().abs() + 1)).all())


@settings(max_examples=40, deadline=None)
@given(
    stage_bits=st.lists(st.integers(1, 8), min_size=2, max_size=4).filter(lambda bits: sum(bits) <= 16),
    kind=st.sampled_from(["key", "value"]),
    scale_dtype=st.sampled_from(["float16", "bfloat16"]),
    seed=st.integers(0, 2**31 - 1),
)
def test_anchor_of_a_multi_stage_spec_is_the_plain_quantization_at_its_width(stage_bits, kind, scale_dtype, seed):
    spec = CodecSpec(stage_bits=tuple(stage_bits), key_group_tokens=8, value_group_channels=16,
                     scale_dtype=scale_dtype)
    plain = CodecSpec(stage_bits=(stage_bits[0],), key_group_tokens=8, value_group_channels=16,
                      scale_dtype=scale_dtype)
    x = _random((21, 3, 16), torch.float32, seed)
    quantize, dequantize = _pair(kind)
    staged, alone = quantize(x, spec), quantize(x, plain)
    assert torch.equal(staged.codes[0], alone.codes[0])
    assert torch.equal(staged.mn, alone.mn) and torch.equal(staged.scale, alone.scale)
    assert torch.equal(dequantize(staged.codes[:1], staged.mn, staged.scale, spec),
                       dequantize(alone.codes, alone.mn, alone.scale, plain))


@pytest.mark.parametrize("kind", ["key", "value"])
@pytest.mark.parametrize("scale_dtype", ["float16", "bfloat16"])
def test_rounded_grid_covers_every_group(kind, scale_dtype):
    spec = CodecSpec(stage_bits=(4, 4), key_group_tokens=8, value_group_channels=8, scale_dtype=scale_dtype)
    x = _random((19, 2, 16), torch.float32, 3, spread=30.0) + 7.3
    codes, mn, scale = _pair(kind)[0](x, spec)
    assert mn.dtype == spec.torch_scale_dtype and scale.dtype == spec.torch_scale_dtype
    low = _per_element(spec, kind, mn, 19)
    high = low + 15 * _per_element(spec, kind, scale, 19)
    assert bool((low <= x.double()).all()) and bool((high >= x.double()).all())


def test_key_groups_are_per_channel_over_token_blocks():
    spec = CodecSpec(stage_bits=(8,), key_group_tokens=4)
    x = _random((10, 2, 64), torch.float32, 1)
    codes, mn, scale = quantize_key(x, spec)
    assert mn.shape == scale.shape == (3, 2, 64)
    assert torch.equal(mn[1], round_down(x[4:8].amin(dim=0), torch.float16))
    assert torch.equal(mn[2], round_down(x[8:].amin(dim=0), torch.float16))
    changed = x.clone()
    changed[9, 1, 5] = 50.0
    _, mn2, scale2 = quantize_key(changed, spec)
    differs = (scale2 != scale).nonzero().tolist()
    assert differs == [[2, 1, 5]]
    assert torch.equal(mn2, mn)


def test_value_groups_are_per_token_over_channel_groups():
    spec = CodecSpec(stage_bits=(8,), value_group_channels=16)
    x = _random((5, 2, 64), torch.float32, 2)
    _, mn, scale = quantize_value(x, spec)
    assert mn.shape == scale.shape == (5, 2, 4)
    changed = x.clone()
    changed[3, 0, 40] = -50.0
    _, mn2, scale2 = quantize_value(changed, spec)
    assert (mn2 != mn).nonzero().tolist() == [[3, 0, 2]]
    assert (scale2 != scale).nonzero().tolist() == [[3, 0, 2]]


@pytest.mark.parametrize("kind", ["key", "value"])
@pytest.mark.parametrize("constant", [0.0, 1.5, -3.0])
def test_constant_groups_give_zero_codes_and_exact_values(kind, constant):
    spec = CodecSpec(stage_bits=(4, 4))
    x = torch.full((65, 2, 64), constant)
    quantize, dequantize = _pair(kind)
    codes, mn, scale = quantize(x, spec)
    assert not any(bool(stage.any()) for stage in codes) and not bool(scale.float().any())
    assert torch.equal(dequantize(codes, mn, scale, spec), x)
    assert torch.equal(dequantize(codes[:1], mn, scale, spec), x)


@pytest.mark.parametrize("kind", ["key", "value"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_input_rejected(kind, bad):
    x = torch.zeros(4, 1, 64)
    x[2, 0, 7] = bad
    with pytest.raises(ValueError, match="NaN or infinite"):
        _pair(kind)[0](x, CodecSpec.preset("int8"))


def test_values_beyond_scale_dtype_range_rejected_unless_bfloat16_scales():
    x = torch.zeros(4, 1, 64)
    x[0, 0, 0] = 1e6
    with pytest.raises(ValueError, match="range of scale_dtype float16"):
        quantize_key(x, CodecSpec.preset("int8"))
    spec = CodecSpec(stage_bits=(4, 4), scale_dtype="bfloat16")
    codes, mn, scale = quantize_key(x, spec)
    rebuilt = dequantize_key(codes, mn, scale, spec)
    assert abs(rebuilt[0, 0, 0].item() - 1e6) <= scale[0, 0, 0].item() / 32


def test_group_range_too_wide_for_scale_dtype_rejected():
    x = torch.zeros(4, 1, 64)
    x[0, 0, 0], x[1, 0, 0] = 60000.0, -60000.0
    with pytest.raises(ValueError, match="overflows scale_dtype"):
        quantize_key(x, CodecSpec(stage_bits=(1,)))


def test_value_head_dim_must_divide_into_groups():
    with pytest.raises(ValueError, match="multiple of value_group_channels"):
        quantize_value(torch.zeros(3, 1, 48), CodecSpec.preset("int8"))


def test_bad_input_shape_and_dtype_rejected():
    spec = CodecSpec.preset("int8")
    with pytest.raises(ValueError, match="tokens, kv_heads, head_dim"):
        quantize_key(torch.zeros(3, 64), spec)
    with pytest.raises(ValueError, match="dtype"):
        quantize_key(torch.zeros(3, 1, 64, dtype=torch.float64), spec)


def test_dequantize_rejects_mismatched_params_and_stage_codes():
    spec = CodecSpec.preset("int8")
    codes, mn, scale = quantize_key(torch.randn(70, 1, 64), spec)
    with pytest.raises(ValueError, match="minima must have shape"):
        dequantize_key(codes, mn[:1], scale, spec)
    with pytest.raises(ValueError, match="1..2 stage tensors"):
        dequantize_key((*codes, codes[0]), mn, scale, spec)
    with pytest.raises(ValueError, match="1..2 stage tensors"):
        dequantize_key(codes[0], mn, scale, spec)
    with pytest.raises(ValueError, match="share the shape"):
        dequantize_key((codes[0], codes[1][:5]), mn, scale, spec)
    v_codes, v_mn, v_scale = quantize_value(torch.randn(70, 1, 64), spec)
    with pytest.raises(ValueError, match="scales must have shape"):
        dequantize_value(v_codes, v_mn, v_scale[:5], spec)
