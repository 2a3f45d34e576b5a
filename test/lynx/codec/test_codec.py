"""encode/decode: wire layout, stream sizes, sink tokens, progressive and exact decoding."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lynx.codec import (
    FORMAT_VERSION,
    CodecSpec,
    EncodedKV,
    decode,
    dequantize_key,
    dequantize_value,
    encode,
    pack_bits,
    quantize_key,
    quantize_value,
)

DTYPES = [torch.float16, torch.bfloat16, torch.float32]


def _kv(tokens, heads=3, head_dim=64, dtype=torch.bfloat16, seed=0):
    generator = torch.Generator().manual_seed(seed)
    key = torch.randn(tokens, heads, head_dim, generator=generator) * torch.linspace(0.1, 8, head_dim)
    value = torch.randn(tokens, heads, head_dim, generator=generator)
    return key.to(dtype), value.to(dtype)


def _bits(tensor):
    return tensor.contiguous().view(torch.uint8)


spec_strategy = st.one_of(
    st.builds(
        CodecSpec,
        stage_bits=st.lists(st.integers(1, 8), min_size=1, max_size=3).filter(lambda b: sum(b) <= 16).map(tuple),
        key_group_tokens=st.sampled_from([1, 7, 16, 64]),
        value_group_channels=st.sampled_from([8, 16, 32]),
        scale_dtype=st.sampled_from(["float16", "bfloat16"]),
        sink_tokens=st.sampled_from([0, 1, 4, 9]),
    ),
    st.sampled_from([CodecSpec.preset(name) for name in CodecSpec.preset_names()]),
)


@settings(max_examples=30, deadline=None)
@given(spec=spec_strategy, tokens=st.integers(1, 80), heads=st.integers(1, 3), dtype=st.sampled_from(DTYPES))
def test_stream_lengths_equal_stream_bytes_and_every_prefix_decodes_as_reference(spec, tokens, heads, dtype):
    key, value = _kv(tokens, heads, 64, dtype, seed=tokens)
    encoded = encode(key, value, spec)
    assert all(stream.dtype == torch.uint8 and stream.dim() == 1 for stream in encoded.streams)
    assert tuple(s.numel() for s in encoded.streams) == spec.stream_bytes(tokens, heads, 64, dtype)
    sinks = min(spec.sink_tokens, tokens)
    for count in range(1, spec.num_quantized_stages + 1):
        k, v = decode(encoded, stages=count)
        assert k.dtype == dtype and k.shape == key.shape
        assert torch.equal(_bits(k[:sinks]), _bits(key[:sinks])) and torch.equal(_bits(v[:sinks]), _bits(value[:sinks]))
        if sinks < tokens:
            key_q, value_q = quantize_key(key[sinks:], spec), quantize_value(value[sinks:], spec)
            expected_k = dequantize_key(key_q.codes[:count], key_q.mn, key_q.scale, spec).to(dtype)
            expected_v = dequantize_value(value_q.codes[:count], value_q.mn, value_q.scale, spec).to(dtype)
            assert torch.equal(k[sinks:], expected_k) and torch.equal(v[sinks:], expected_v)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tokens", [1, 4, 63, 65, 130])
def test_bf16_exact_returns_input_bit_for_bit(dtype, tokens):
    key, value = _kv(tokens, dtype=dtype, seed=tokens)
    k, v = decode(encode(key, value, CodecSpec.preset("bf16-exact")))
    assert k.dtype == dtype and torch.equal(_bits(k), _bits(key)) and torch.equal(_bits(v), _bits(value))


@pytest.mark.parametrize("preset", ["int8", "int16", "bf16-exact"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tokens", [1, 5, 63, 130])
def test_anchor_only_decode_equals_the_int4_preset_bit_for_bit(preset, dtype, tokens):
    key, value = _kv(tokens, dtype=dtype, seed=tokens + 1)
    encoded = encode(key, value, CodecSpec.preset(preset))
    plain = encode(key, value, CodecSpec.preset("int4"))
    assert torch.equal(encoded.streams[0], plain.streams[0])
    anchor_k, anchor_v = decode(encoded, stages=1)
    int4_k, int4_v = decode(plain)
    assert torch.equal(_bits(anchor_k), _bits(int4_k)) and torch.equal(_bits(anchor_v), _bits(int4_v))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tokens", [1, 63, 65, 130])
def test_each_prefix_of_three_stages_within_half_its_step(dtype, tokens):
    spec = CodecSpec(stage_bits=(2, 2, 4))
    key, value = _kv(tokens, dtype=dtype, seed=tokens + 2)
    encoded = encode(key, value, spec)
    sinks = min(spec.sink_tokens, tokens)
    key_scale = quantize_key(key[sinks:], spec).scale if sinks < tokens else None
    value_scale = quantize_value(value[sinks:], spec).scale if sinks < tokens else None
    for count, step in ((1, 1.0), (2, 1 / 4), (3, 1 / 64)):
        k, v = decode(encoded, stages=count)
        assert torch.equal(k[:sinks], key[:sinks]) and torch.equal(v[:sinks], value[:sinks])
        if key_scale is None:
            continue
        key_bound = key_scale.double().repeat_interleave(64, dim=0)[: tokens - sinks] * step / 2
        value_bound = value_scale.double().repeat_interleave(64, dim=2) * step / 2
        rounding = torch.finfo(dtype).eps
        for got, want, bound in ((k[sinks:], key[sinks:], key_bound), (v[sinks:], value[sinks:], value_bound)):
            gap = (got.double() - want.double()).abs()
            assert bool((gap <= bound + rounding * got.double().abs() + 1e-6).all())


@pytest.mark.parametrize("name", ["int8", "int16"])
def test_full_decode_error_within_half_the_finest_step(name):
    spec = CodecSpec.preset(name)
    key, value = _kv(130, dtype=torch.float32, seed=5)
    k, v = decode(encode(key, value, spec))
    step = 2.0 ** -(spec.total_bits - spec.anchor_bits)
    key_scale, value_scale = quantize_key(key[4:], spec).scale, quantize_value(value[4:], spec).scale
    key_bound = key_scale.double().repeat_interleave(64, dim=0)[:126] * step / 2
    value_bound = value_scale.double().repeat_interleave(64, dim=2) * step / 2
    assert torch.equal(k[:4], key[:4]) and torch.equal(v[:4], value[:4])
    assert bool(((k[4:].double() - key[4:].double()).abs() <= key_bound + 1e-6 * (key[4:].double().abs() + 1)).all())
    assert bool(((v[4:].double() - value[4:].double()).abs() <= value_bound + 1e-6 * (value[4:].double().abs() + 1)).all())


@pytest.mark.parametrize("tokens", [1, 3, 4])
def test_requests_of_sink_tokens_only_travel_raw_in_the_anchor(tokens):
    key, value = _kv(tokens, seed=8)
    encoded = encode(key, value, CodecSpec.preset("int8"))
    assert encoded.streams[0].numel() == 2 * key.numel() * 2 and encoded.streams[1].numel() == 0
    for count in (1, 2):
        k, v = decode(encoded, stages=count)
        assert torch.equal(k, key) and torch.equal(v, value)


def test_format_version_is_two():
    assert FORMAT_VERSION == 2


def test_all_zero_input_decodes_to_zeros_at_every_stage():
    key = torch.zeros(65, 3, 64, dtype=torch.bfloat16)
    encoded = encode(key, key.clone(), CodecSpec(stage_bits=(2, 2, 4)))
    for count in (1, 2, 3):
        k, v = decode(encoded, stages=count)
        assert torch.equal(k, key) and torch.equal(v, key)


def test_wire_layout_is_sinks_then_params_then_packed_codes_per_stage():
    spec = CodecSpec(stage_bits=(4, 3, 5), key_group_tokens=16, value_group_channels=32, sink_tokens=2)
    key, value = _kv(21, heads=2, head_dim=64, dtype=torch.float16, seed=9)
    encoded = encode(key, value, spec)
    key_q, value_q = quantize_key(key[2:], spec), quantize_value(value[2:], spec)
    params = [_bits(t).reshape(-1) for t in (key[:2], value[:2], key_q.mn, key_q.scale, value_q.mn, value_q.scale)]
    codes = [pack_bits(key_q.codes[0].reshape(-1), 4), pack_bits(value_q.codes[0].reshape(-1), 4)]
    assert torch.equal(encoded.streams[0], torch.cat(params + codes))
    for index, width in ((1, 3), (2, 5)):
        expected = torch.cat([pack_bits(q.codes[index].reshape(-1), width) for q in (key_q, value_q)])
        assert torch.equal(encoded.streams[index], expected)


def test_raw_residual_stream_is_quantized_key_bytes_then_value_bytes():
    key, value = _kv(7, dtype=torch.float32)
    encoded = encode(key, value, CodecSpec.preset("bf16-exact"))
    assert torch.equal(encoded.streams[1], torch.cat([_bits(key[4:]).reshape(-1), _bits(value[4:]).reshape(-1)]))


@pytest.mark.parametrize("preset", ["int8", "bf16-exact"])
def test_non_contiguous_inputs_give_same_streams_as_contiguous_copies(preset):
    generator = torch.Generator().manual_seed(4)
    key = torch.randn(3, 65, 64, generator=generator, dtype=torch.float32).to(torch.bfloat16).transpose(0, 1)
    value = torch.randn(65, 3, 128, generator=generator).to(torch.bfloat16)[..., ::2]
    assert not key.is_contiguous() and not value.is_contiguous()
    spec = CodecSpec.preset(preset)
    strided = encode(key, value, spec)
    dense = encode(key.contiguous(), value.contiguous(), spec)
    assert all(torch.equal(a, b) for a, b in zip(strided.streams, dense.streams, strict=True))


def test_int8_anchor_bytes_per_token_close_to_quarter_of_bf16():
    key, value = _kv(640)
    anchor_bytes = encode(key, value, CodecSpec.preset("int8")).streams[0].numel()
    bf16_bytes = 2 * key.numel() * 2
    assert anchor_bytes <= 0.29 * bf16_bytes
    assert anchor_bytes == encode(key, value, CodecSpec.preset("int4")).streams[0].numel()


def test_receiver_decodes_from_anchor_stream_alone():
    spec = CodecSpec.preset("int8")
    key, value = _kv(70, seed=2)
    encoded = encode(key, value, spec)
    received = EncodedKV.from_streams([encoded.streams[0].clone()], spec, 70, 3, 64, torch.bfloat16)
    assert received.num_received_stages == 1
    k, v = decode(received)
    expected_k, expected_v = decode(encoded, stages=1)
    assert torch.equal(k, expected_k) and torch.equal(v, expected_v)
    with pytest.raises(ValueError, match="stages must be an int in 1..1"):
        decode(received, stages=2)


@pytest.mark.parametrize("stages", [0, -1, 3, True, 1.0])
def test_decode_rejects_stage_count_out_of_range(stages):
    encoded = encode(*_kv(4), CodecSpec.preset("int8"))
    with pytest.raises(ValueError, match="stages must be an int"):
        decode(encoded, stages=stages)


def test_from_streams_rejects_wrong_lengths_and_counts():
    spec = CodecSpec.preset("int8")
    streams = encode(*_kv(9), spec).streams
    with pytest.raises(ValueError, match="stream 1 holds"):
        EncodedKV.from_streams([streams[0], streams[1][:-1]], spec, 9, 3, 64, torch.bfloat16)
    with pytest.raises(ValueError, match="stream 0 holds"):
        EncodedKV.from_streams(streams, spec, 10, 3, 64, torch.bfloat16)
    with pytest.raises(ValueError, match="between 1 and 2 streams"):
        EncodedKV.from_streams([*streams, streams[1]], spec, 9, 3, 64, torch.bfloat16)
    with pytest.raises(ValueError, match="between 1 and 2 streams"):
        EncodedKV.from_streams([], spec, 9, 3, 64, torch.bfloat16)
    with pytest.raises(ValueError, match="uint8"):
        EncodedKV.from_streams([streams[0].to(torch.int32)], spec, 9, 3, 64, torch.bfloat16)


def test_encode_rejects_non_finite_and_mismatched_inputs():
    spec = CodecSpec.preset("int8")
    key, value = _kv(5)
    bad = key.clone()
    bad[1, 1, 1] = float("nan")
    with pytest.raises(ValueError, match="key contains NaN or infinite"):
        encode(bad, value, spec)
    bad_value = value.clone()
    bad_value[0, 0, 0] = float("inf")
    with pytest.raises(ValueError, match="value contains NaN or infinite"):
        encode(key, bad_value, spec)
    with pytest.raises(ValueError, match="share shape, dtype and device"):
        encode(key, value.float(), spec)
    with pytest.raises(ValueError, match="multiple of value_group_channels"):
        encode(key[..., :48], value[..., :48], spec)
