"""Reference pool operations: gather-encode, scatter-decode, exact upgrade, validation."""

import pytest
import torch

from lynx.codec import (
    CodecSpec,
    EncodedKV,
    decode,
    decode_into_pool,
    encode,
    encode_from_pool,
    gather_encode,
    scatter_decode,
    scatter_upgrade,
    select_backend,
    upgrade_in_pool,
)

DTYPES = [torch.float16, torch.bfloat16, torch.float32]
PRESETS = list(CodecSpec.preset_names())
MULTI_STAGE = [CodecSpec.preset("int8"), CodecSpec.preset("int16"), CodecSpec(stage_bits=(2, 2, 4))]
MULTI_STAGE += [CodecSpec.preset("bf16-exact")]


def _pools(pool_size, heads=2, head_dim=64, dtype=torch.bfloat16, seed=0):
    generator = torch.Generator().manual_seed(seed)
    shape = (pool_size, heads, head_dim)
    key = torch.randn(shape, generator=generator) * torch.linspace(0.1, 8, head_dim)
    value = torch.randn(shape, generator=generator)
    return key.to(dtype), value.to(dtype)


def _slots(tokens, pool_size, seed=0):
    """``tokens`` distinct slots in shuffled order, as a request's tokens sit in a pool."""
    return torch.randperm(pool_size, generator=torch.Generator().manual_seed(seed))[:tokens]


def _bits(tensor):
    return tensor.contiguous().view(torch.uint8)


def _same_streams(a, b):
    return len(a.streams) == len(b.streams) and all(torch.equal(x, y) for x, y in zip(a.streams, b.streams))


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("tokens", [1, 63, 65, 130])
def test_encode_from_pool_equals_encode_of_gathered_tokens(preset, dtype, tokens):
    spec = CodecSpec.preset(preset)
    k_pool, v_pool = _pools(2 * tokens + 7, dtype=dtype, seed=tokens)
    slots = _slots(tokens, 2 * tokens + 7, seed=tokens)
    encoded = encode_from_pool(k_pool, v_pool, slots, spec)
    assert _same_streams(encoded, encode(k_pool[slots], v_pool[slots], spec))
    assert (encoded.num_tokens, encoded.dtype) == (tokens, dtype)


@pytest.mark.parametrize("spec", MULTI_STAGE, ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_decode_into_pool_writes_each_prefix_decode_at_its_slots_only(spec, dtype):
    tokens, pool_size = 65, 150
    k_src, v_src = _pools(pool_size, dtype=dtype, seed=1)
    slots = _slots(tokens, pool_size, seed=2)
    encoded = encode_from_pool(k_src, v_src, slots, spec)
    targets = _slots(tokens, pool_size, seed=3)
    others = torch.ones(pool_size, dtype=torch.bool)
    others[targets] = False
    for stages in range(1, spec.num_stages + 1):
        k_pool, v_pool = _pools(pool_size, dtype=dtype, seed=4)
        k_before, v_before = k_pool.clone(), v_pool.clone()
        decode_into_pool(encoded, k_pool, v_pool, targets, stages)
        key, value = decode(encoded, stages)
        assert torch.equal(_bits(k_pool[targets]), _bits(key)) and torch.equal(_bits(v_pool[targets]), _bits(value))
        assert torch.equal(_bits(k_pool[others]), _bits(k_before[others]))
        assert torch.equal(_bits(v_pool[others]), _bits(v_before[others]))


def test_decode_into_pool_casts_to_the_pool_dtype():
    k_src, v_src = _pools(40, dtype=torch.float32, seed=5)
    slots = _slots(20, 40, seed=5)
    encoded = encode_from_pool(k_src, v_src, slots, CodecSpec.preset("int16"))
    k_pool, v_pool = torch.zeros(30, 2, 64, dtype=torch.bfloat16), torch.zeros(30, 2, 64, dtype=torch.bfloat16)
    decode_into_pool(encoded, k_pool, v_pool, torch.arange(10, 30))
    key, value = decode(encoded)
    assert torch.equal(_bits(k_pool[10:]), _bits(key.to(torch.bfloat16)))
    assert torch.equal(_bits(v_pool[10:]), _bits(value.to(torch.bfloat16)))


@pytest.mark.parametrize("spec", MULTI_STAGE, ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("tokens", [1, 63, 130])
def test_upgrade_after_anchor_is_bit_identical_to_full_decode(spec, dtype, tokens):
    pool_size = tokens + 20
    k_src, v_src = _pools(pool_size, dtype=dtype, seed=tokens)
    slots = _slots(tokens, pool_size, seed=tokens + 1)
    full = encode_from_pool(k_src, v_src, slots, spec)
    anchor_only = EncodedKV.from_streams(full.streams[:1], spec, tokens, 2, 64, dtype)
    k_pool, v_pool = _pools(pool_size, dtype=dtype, seed=9)
    k_expected, v_expected = k_pool.clone(), v_pool.clone()
    decode_into_pool(anchor_only, k_pool, v_pool, slots)
    upgrade_in_pool(full, k_pool, v_pool, slots)
    decode_into_pool(full, k_expected, v_expected, slots)
    assert torch.equal(_bits(k_pool), _bits(k_expected)) and torch.equal(_bits(v_pool), _bits(v_expected))


def test_upgrade_does_not_depend_on_what_the_slots_held():
    spec = CodecSpec.preset("int8")
    k_src, v_src = _pools(64, seed=11)
    slots = _slots(33, 64, seed=11)
    encoded = encode_from_pool(k_src, v_src, slots, spec)
    k_pool, v_pool = torch.full_like(k_src, float("nan")), torch.full_like(v_src, 1e4)
    upgrade_in_pool(encoded, k_pool, v_pool, slots)
    key, value = decode(encoded)
    assert torch.equal(_bits(k_pool[slots]), _bits(key)) and torch.equal(_bits(v_pool[slots]), _bits(value))


def test_repeated_layers_round_trip_through_strided_pools_and_int32_slots():
    spec = CodecSpec.preset("int8")
    layers = [_pools(90, head_dim=128, seed=layer) for layer in range(3)]
    slots = _slots(70, 90, seed=12).to(torch.int32)
    targets = _slots(70, 90, seed=13)
    for k_src, v_src in layers:
        k_view, v_view = k_src[:, :, ::2], v_src[:, :, 1::2]
        encoded = encode_from_pool(k_view, v_view, slots, spec)
        assert _same_streams(encoded, encode(k_view[slots.long()], v_view[slots.long()], spec))
        k_out, v_out = torch.zeros(90, 2, 128, dtype=torch.bfloat16), torch.zeros(90, 2, 128, dtype=torch.bfloat16)
        decode_into_pool(encoded, k_out[:, :, :64], v_out[:, :, 64:], targets)
        key, value = decode(encoded)
        assert torch.equal(k_out[targets, :, :64], key) and torch.equal(v_out[targets, :, 64:], value)
        assert not k_out[:, :, 64:].any() and not v_out[:, :, :64].any()


def test_dispatch_functions_equal_reference_on_cpu():
    spec = CodecSpec.preset("int8")
    k_src, v_src = _pools(50, seed=14)
    slots = _slots(40, 50, seed=14)
    encoded = gather_encode(k_src, v_src, slots, spec)
    assert select_backend("auto", k_src, spec) == "reference"
    assert _same_streams(encoded, encode_from_pool(k_src, v_src, slots, spec))
    k_pool, v_pool = torch.zeros_like(k_src), torch.zeros_like(v_src)
    scatter_decode(encoded, k_pool, v_pool, slots, stages=1, backend="reference")
    assert torch.equal(k_pool[slots], decode(encoded, stages=1)[0])
    scatter_upgrade(encoded, k_pool, v_pool, slots)
    assert torch.equal(k_pool[slots], decode(encoded)[0]) and torch.equal(v_pool[slots], decode(encoded)[1])
    with pytest.raises(ValueError, match="backend must be one of"):
        gather_encode(k_src, v_src, slots, spec, backend="cuda")


def _valid():
    k_pool, v_pool = _pools(20, seed=15)
    return k_pool, v_pool, torch.tensor([3, 1, 4, 0, 5])


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda k, v, i: (k, v, torch.tensor([3, 20])), r"token_indices must lie in \[0, 20\)"),
        (lambda k, v, i: (k, v, torch.tensor([-1, 2])), r"token_indices must lie in \[0, 20\)"),
        (lambda k, v, i: (k, v.half(), i), "must share shape and dtype"),
        (lambda k, v, i: (k, v[:, :1], i), "must share shape and dtype"),
        (lambda k, v, i: (k, torch.empty_like(v, device="meta"), i), "must share a device"),
        (lambda k, v, i: (k, v, i.float()), "token_indices dtype"),
        (lambda k, v, i: (k, v, i[None]), "1-D tensor"),
        (lambda k, v, i: (k, v, i[:0]), "empty"),
        (lambda k, v, i: (k.int(), v.int(), i), "k_pool dtype"),
        (lambda k, v, i: (k[0], v, i), r"\[pool_size, kv_heads, head_dim\]"),
    ],
)
def test_pool_operations_reject_bad_pools_and_slots(mutate, message):
    k_pool, v_pool, slots = mutate(*_valid())
    with pytest.raises(ValueError, match=message):
        encode_from_pool(k_pool, v_pool, slots, CodecSpec.preset("int8"))


def test_decode_rejects_mismatched_encoded_repeated_slots_and_lone_anchor_upgrade():
    k_pool, v_pool, slots = _valid()
    encoded = encode_from_pool(k_pool, v_pool, slots, CodecSpec.preset("int8"))
    with pytest.raises(ValueError, match="holds 5 tokens but 4 slots"):
        decode_into_pool(encoded, k_pool, v_pool, slots[:4])
    with pytest.raises(ValueError, match="repeats a slot"):
        decode_into_pool(encoded, k_pool, v_pool, torch.tensor([1, 2, 3, 2, 0]))
    with pytest.raises(ValueError, match="pool slots are"):
        decode_into_pool(encoded, k_pool[:, :1].contiguous(), v_pool[:, :1].contiguous(), slots)
    with pytest.raises(ValueError, match="stages must be an int in 1..2"):
        decode_into_pool(encoded, k_pool, v_pool, slots, stages=3)
    with pytest.raises(ValueError, match="must be an EncodedKV"):
        decode_into_pool(encoded.streams, k_pool, v_pool, slots)
    anchor_only = EncodedKV.from_streams(encoded.streams[:1], encoded.spec, 5, 2, 64, torch.bfloat16)
    with pytest.raises(ValueError, match="beyond the anchor"):
        upgrade_in_pool(anchor_only, k_pool, v_pool, slots)
