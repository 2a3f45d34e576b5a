"""Triton pool kernels against the pure-PyTorch reference: streams byte for byte, pools bit for bit.

Runs on CPU under ``TRITON_INTERPRET=1`` (see conftest.py). The reference
lives in :mod:`lynx.codec.pool` and is imported beside each comparison.
"""

import pytest
import torch

pytest.importorskip("triton", reason="the Triton kernels need the triton package")

import lynx_kernels  # noqa: E402
from lynx.codec import CodecSpec, EncodedKV, gather_encode, scatter_decode, select_backend  # noqa: E402
from lynx.codec.layout import anchor_sections  # noqa: E402
from lynx.codec.pool import decode_into_pool as reference_decode  # noqa: E402
from lynx.codec.pool import encode_from_pool as reference_encode  # noqa: E402
from lynx.codec.pool import upgrade_in_pool as reference_upgrade  # noqa: E402

DTYPES = [torch.float16, torch.bfloat16, torch.float32]
PRESETS = list(CodecSpec.preset_names())
TOKENS = [1, 63, 65, 130]


def _pools(pool_size, heads=2, head_dim=64, dtype=torch.bfloat16, seed=0, spread=8.0):
    generator = torch.Generator().manual_seed(seed)
    shape = (pool_size, heads, head_dim)
    key = torch.randn(shape, generator=generator) * torch.linspace(0.1, spread, head_dim)
    value = torch.randn(shape, generator=generator)
    return key.to(dtype), value.to(dtype)


def _slots(tokens, pool_size, seed):
    return torch.randperm(pool_size, generator=torch.Generator().manual_seed(seed))[:tokens]


def _bits(tensor):
    return tensor.contiguous().view(torch.uint8)


def _assert_same_streams(kernel, reference):
    assert len(kernel.streams) == len(reference.streams)
    for index, (ours, theirs) in enumerate(zip(kernel.streams, reference.streams)):
        assert torch.equal(ours, theirs), f"stream {index} differs at bytes {(ours != theirs).nonzero()[:8].tolist()}"


def _assert_decodes_alike(encoded, pool_size, targets, dtype, stages=None):
    """Kernel and reference decode into identical copies leave identical pools."""
    k_ref, v_ref = _pools(pool_size, head_dim=encoded.head_dim, heads=encoded.kv_heads, dtype=dtype, seed=99)
    k_ker, v_ker = k_ref.clone(), v_ref.clone()
    reference_decode(encoded, k_ref, v_ref, targets, stages)
    lynx_kernels.decode_into_pool(encoded, k_ker, v_ker, targets, stages)
    assert torch.equal(_bits(k_ker), _bits(k_ref)) and torch.equal(_bits(v_ker), _bits(v_ref))


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_encode_and_every_prefix_decode_match_reference(preset, dtype):
    spec = CodecSpec.preset(preset)
    tokens = TOKENS[(PRESETS.index(preset) + DTYPES.index(dtype)) % len(TOKENS)]
    pool_size = tokens + 37
    k_pool, v_pool = _pools(pool_size, dtype=dtype, seed=tokens)
    slots = _slots(tokens, pool_size, seed=tokens)
    encoded = lynx_kernels.encode_from_pool(k_pool, v_pool, slots, spec)
    _assert_same_streams(encoded, reference_encode(k_pool, v_pool, slots, spec))
    targets = _slots(tokens, pool_size, seed=tokens + 1)
    for stages in range(1, spec.num_stages + 1):
        _assert_decodes_alike(encoded, pool_size, targets, dtype, stages)


@pytest.mark.parametrize("tokens", TOKENS)
def test_partial_key_blocks_match_reference(tokens):
    spec = CodecSpec.preset("int8")
    k_pool, v_pool = _pools(140, dtype=torch.bfloat16, seed=tokens + 5)
    slots = _slots(tokens, 140, seed=tokens + 5)
    encoded = lynx_kernels.encode_from_pool(k_pool, v_pool, slots, spec)
    _assert_same_streams(encoded, reference_encode(k_pool, v_pool, slots, spec))
    _assert_decodes_alike(encoded, 140, _slots(tokens, 140, seed=tokens + 6), torch.bfloat16)


@pytest.mark.parametrize(
    ("spec", "head_dim"),
    [
        (CodecSpec(stage_bits=(3, 5), key_group_tokens=7, value_group_channels=8, scale_dtype="bfloat16",
                   sink_tokens=0), 24),
        (CodecSpec(stage_bits=(2, 2, 4), key_group_tokens=16, value_group_channels=16, sink_tokens=9), 48),
        (CodecSpec(stage_bits=(1, 2, 3, 7), key_group_tokens=100, value_group_channels=32), 96),
        (CodecSpec(stage_bits=(5,), key_group_tokens=3, value_group_channels=8, raw_residual=True), 40),
        (CodecSpec(stage_bits=(16,), key_group_tokens=64, value_group_channels=64, scale_dtype="bfloat16"), 64),
    ],
    ids=str,
)
@pytest.mark.slow
def test_general_widths_groups_and_head_dims_match_reference(spec, head_dim):
    assert lynx_kernels.supports(spec, head_dim)
    k_pool, v_pool = _pools(50, heads=3, head_dim=head_dim, dtype=torch.float16, seed=head_dim)
    slots = _slots(37, 50, seed=head_dim)
    encoded = lynx_kernels.encode_from_pool(k_pool, v_pool, slots, spec)
    _assert_same_streams(encoded, reference_encode(k_pool, v_pool, slots, spec))
    for stages in range(1, spec.num_stages + 1):
        _assert_decodes_alike(encoded, 50, _slots(37, 50, seed=1), torch.float16, stages)


def _edge_pools(dtype, scale_dtype):
    """Constant groups, zeros, tiny and subnormal values, values near the scale dtype's limit.

    Values that underflow to zero in ``dtype`` all have one sign per group of
    8 quantized tokens (slots 39..0 after 4 sink tokens), so no group mixes
    +0.0 and -0.0 (see the signed-zero test below).
    """
    k_pool, v_pool = _pools(72, dtype=torch.float32, seed=3)
    k_pool[:8] = 0.0
    k_pool[8:16] = -2.5
    k_pool[16:24] = k_pool[16:24].abs() * 1e-6
    k_pool[24:32] = -torch.linspace(0, 3e-38, 128).reshape(1, 2, 64)
    v_pool[:8, :, :32] = -0.0
    v_pool[8:16] = v_pool[8:16].abs() * 1e-7
    v_pool[16:24] = torch.linspace(1e-40, 2e-40, 128).reshape(1, 2, 64)
    limit = 3e4 if torch.float16 in (dtype, getattr(torch, scale_dtype)) else 1e37
    v_pool[24:32, 0] = torch.linspace(-limit, limit, 64)
    return k_pool.to(dtype), v_pool.to(dtype)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("scale_dtype", ["float16", "bfloat16"])
def test_edge_values_match_reference(dtype, scale_dtype):
    spec = CodecSpec(stage_bits=(4, 4), key_group_tokens=8, value_group_channels=16, scale_dtype=scale_dtype)
    k_pool, v_pool = _edge_pools(dtype, scale_dtype)
    slots = torch.cat([torch.arange(40, 40 + spec.sink_tokens), torch.arange(40).flip(0)])
    encoded = lynx_kernels.encode_from_pool(k_pool, v_pool, slots, spec)
    _assert_same_streams(encoded, reference_encode(k_pool, v_pool, slots, spec))
    for stages in (1, 2):
        _assert_decodes_alike(encoded, 72, _slots(slots.numel(), 72, seed=7), dtype, stages)


def test_group_mixing_signed_zeros_gets_negative_zero_minimum_and_decodes_like_reference():
    """``torch.amin`` leaves the sign of a zero minimum to reduction order; the
    kernels order -0.0 below +0.0. Only the sign bit of such minima (and
    scales) may differ from the reference; codes and decoded values do not.
    """
    spec = CodecSpec(stage_bits=(4, 4), key_group_tokens=4, value_group_channels=8, sink_tokens=0)
    k_pool = torch.zeros(8, 1, 8)
    k_pool[0::4] = -0.0
    v_pool = torch.zeros(8, 1, 8)
    v_pool[:, :, 0] = -0.0
    slots = torch.arange(8)
    encoded = lynx_kernels.encode_from_pool(k_pool, v_pool, slots, spec)
    reference = reference_encode(k_pool, v_pool, slots, spec)
    sections = anchor_sections(spec, 8, 1, 8, torch.float32)
    key_params, value_params = sections.key_minima, sections.value_minima
    anchor = encoded.streams[0]
    assert torch.signbit(anchor[:key_params].view(torch.float16)).all()
    assert torch.signbit(anchor[2 * key_params : 2 * key_params + value_params].view(torch.float16)).all()
    params = 2 * (key_params + value_params)
    assert torch.equal(anchor[:params].view(torch.float16), reference.streams[0][:params].view(torch.float16))
    assert torch.equal(anchor[params:], reference.streams[0][params:])
    assert torch.equal(encoded.streams[1], reference.streams[1])
    k_ker, v_ker = torch.ones(8, 1, 8), torch.ones(8, 1, 8)
    k_ref, v_ref = torch.ones(8, 1, 8), torch.ones(8, 1, 8)
    lynx_kernels.decode_into_pool(encoded, k_ker, v_ker, slots)
    reference_decode(reference, k_ref, v_ref, slots)
    assert torch.equal(_bits(k_ker), _bits(k_ref)) and torch.equal(_bits(v_ker), _bits(v_ref))


@pytest.mark.parametrize("preset", ["int8", "int16", "bf16-exact"])
def test_upgrade_after_anchor_is_bit_identical_to_full_reference_decode(preset):
    spec = CodecSpec.preset(preset)
    k_src, v_src = _pools(80, dtype=torch.bfloat16, seed=21)
    slots = _slots(65, 80, seed=21)
    full = lynx_kernels.encode_from_pool(k_src, v_src, slots, spec)
    anchor_only = EncodedKV.from_streams(full.streams[:1], spec, 65, 2, 64, torch.bfloat16)
    k_pool, v_pool = _pools(80, dtype=torch.bfloat16, seed=22)
    k_expected, v_expected = k_pool.clone(), v_pool.clone()
    lynx_kernels.decode_into_pool(anchor_only, k_pool, v_pool, slots)
    lynx_kernels.upgrade_in_pool(full, k_pool, v_pool, slots)
    reference_upgrade(full, k_expected, v_expected, slots)
    assert torch.equal(_bits(k_pool), _bits(k_expected)) and torch.equal(_bits(v_pool), _bits(v_expected))


def test_repeated_layers_through_strided_pools_and_int32_slots_match_reference():
    spec = CodecSpec.preset("int8")
    slots = _slots(65, 80, seed=30).to(torch.int32)
    for layer in range(2):
        k_big, v_big = _pools(80, head_dim=128, dtype=torch.float16, seed=layer)
        k_pool, v_pool = k_big[:, :, ::2], v_big[:, :, 64:]
        encoded = lynx_kernels.encode_from_pool(k_pool, v_pool, slots, spec)
        _assert_same_streams(encoded, reference_encode(k_pool, v_pool, slots, spec))
        k_out, v_out = torch.zeros_like(k_big), torch.zeros_like(v_big)
        k_ref, v_ref = torch.zeros_like(k_big), torch.zeros_like(v_big)
        lynx_kernels.decode_into_pool(encoded, k_out[:, :, 1::2], v_out[:, :, :64], slots)
        reference_decode(encoded, k_ref[:, :, 1::2], v_ref[:, :, :64], slots)
        assert torch.equal(_bits(k_out), _bits(k_ref)) and torch.equal(_bits(v_out), _bits(v_ref))


def test_a_head_range_of_a_pool_encodes_and_lands_in_another_pools_heads_like_reference():
    """Tensor parallelism re-slices heads: heads [1, 3) of 4, into heads [0, 2) of 3 (views)."""
    spec = CodecSpec.preset("int8")
    slots = _slots(70, 90, seed=50)
    k_big, v_big = _pools(90, heads=4, seed=50)
    encoded = lynx_kernels.encode_from_pool(k_big[:, 1:3], v_big[:, 1:3], slots, spec)
    _assert_same_streams(encoded, reference_encode(k_big[:, 1:3], v_big[:, 1:3], slots, spec))
    k_out, v_out = torch.ones(90, 3, 64, dtype=torch.bfloat16), torch.ones(90, 3, 64, dtype=torch.bfloat16)
    k_ref, v_ref = k_out.clone(), v_out.clone()
    lynx_kernels.decode_into_pool(encoded, k_out[:, :2], v_out[:, :2], slots)
    reference_decode(encoded, k_ref[:, :2], v_ref[:, :2], slots)
    assert torch.equal(_bits(k_out), _bits(k_ref)) and torch.equal(_bits(v_out), _bits(v_ref))


@pytest.mark.parametrize("preset", ["int8", "bf16-exact"])
def test_received_streams_at_odd_buffer_offsets_decode_like_reference(preset):
    spec = CodecSpec.preset(preset)
    k_pool, v_pool = _pools(40, dtype=torch.float16, seed=40)
    slots = _slots(33, 40, seed=40)
    sent = lynx_kernels.encode_from_pool(k_pool, v_pool, slots, spec)
    buffer = torch.zeros(1 + sum(stream.numel() + 1 for stream in sent.streams), dtype=torch.uint8)
    received, start = [], 1
    for stream in sent.streams:
        buffer[start : start + stream.numel()] = stream
        received.append(buffer[start : start + stream.numel()])
        start += stream.numel() + 1
    encoded = EncodedKV.from_streams(received, spec, 33, 2, 64, torch.float16)
    for stages in range(1, spec.num_stages + 1):
        _assert_decodes_alike(encoded, 40, slots.flip(0), torch.float16, stages)


@pytest.mark.parametrize(
    ("dtype", "value", "stage_bits", "slot", "message"),
    [
        (torch.float32, float("nan"), (4, 4), 6, "value contains NaN or infinite"),
        (torch.float32, float("nan"), (4, 4), 2, "value contains NaN or infinite"),
        (torch.bfloat16, float("inf"), (4, 4), 6, "value contains NaN or infinite"),
        (torch.bfloat16, float("inf"), (4, 4), 3, "value contains NaN or infinite"),
        (torch.float32, 1e5, (4, 4), 6, r"value has values beyond \+-65504"),
        (torch.float32, 1e5, (4, 4), 1, r"value has values beyond \+-65504"),
        (torch.float16, 6e4, (1,), 6, "value group minimum or scale overflows"),
    ],
)
@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_invalid_values_in_sink_or_quantized_tokens_raise_the_reference_error(dtype, value, stage_bits, slot, message):
    spec = CodecSpec(stage_bits=stage_bits)
    k_pool, v_pool = _pools(10, dtype=dtype, seed=1, spread=1.0)
    v_pool[slot, 1, 5] = value
    v_pool[slot, 1, 6] = -value
    for encode in (reference_encode, lynx_kernels.encode_from_pool):
        with pytest.raises(ValueError, match=message):
            encode(k_pool, v_pool, torch.arange(1, 9), spec)


def test_kernels_validate_like_the_reference():
    k_pool, v_pool = _pools(10, seed=2)
    spec = CodecSpec.preset("int8")
    with pytest.raises(ValueError, match=r"must lie in \[0, 10\)"):
        lynx_kernels.encode_from_pool(k_pool, v_pool, torch.tensor([0, 10]), spec)
    encoded = lynx_kernels.encode_from_pool(k_pool, v_pool, torch.arange(4), spec)
    with pytest.raises(ValueError, match="repeats a slot"):
        lynx_kernels.decode_into_pool(encoded, k_pool, v_pool, torch.tensor([1, 1, 2, 3]))
    with pytest.raises(ValueError, match="stages must be an int in 1..2"):
        lynx_kernels.decode_into_pool(encoded, k_pool, v_pool, torch.arange(4), stages=0)
    with pytest.raises(ValueError, match="beyond the anchor"):
        lynx_kernels.upgrade_in_pool(EncodedKV.from_streams(encoded.streams[:1], spec, 4, 2, 64, torch.bfloat16),
                                     k_pool, v_pool, torch.arange(4))


def test_supports_names_what_the_kernels_handle():
    assert all(lynx_kernels.supports(CodecSpec.preset(name), 128) for name in PRESETS)
    assert not lynx_kernels.supports(CodecSpec(stage_bits=(1, 1, 1, 1, 1)), 64)
    assert not lynx_kernels.supports(CodecSpec(stage_bits=(3,), value_group_channels=4), 12)
    assert not lynx_kernels.supports(CodecSpec(stage_bits=(4,), value_group_channels=24), 48)
    assert not lynx_kernels.supports(CodecSpec(stage_bits=(4,), key_group_tokens=4096), 64)


def test_dispatch_uses_kernels_when_forced_and_falls_back_for_unsupported_specs():
    k_pool, v_pool = _pools(30, head_dim=12, seed=3)
    slots = _slots(20, 30, seed=3)
    odd = CodecSpec(stage_bits=(3,), value_group_channels=4)
    assert select_backend("triton", k_pool, odd) == "reference"
    _assert_same_streams(gather_encode(k_pool, v_pool, slots, odd, backend="triton"),
                         reference_encode(k_pool, v_pool, slots, odd))
    k_pool, v_pool = _pools(30, seed=3)
    spec = CodecSpec.preset("int8")
    assert select_backend("triton", k_pool, spec) == "triton"
    assert select_backend("auto", k_pool, spec) == "reference"
    encoded = gather_encode(k_pool, v_pool, slots, spec, backend="triton")
    _assert_same_streams(encoded, reference_encode(k_pool, v_pool, slots, spec))
    k_out, v_out = torch.zeros_like(k_pool), torch.zeros_like(v_pool)
    scatter_decode(encoded, k_out, v_out, slots, backend="triton")
    k_ref, v_ref = torch.zeros_like(k_pool), torch.zeros_like(v_pool)
    reference_decode(encoded, k_ref, v_ref, slots)
    assert torch.equal(_bits(k_out), _bits(k_ref)) and torch.equal(_bits(v_out), _bits(v_ref))
