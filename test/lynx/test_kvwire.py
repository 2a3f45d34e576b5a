import pytest
import torch

from lynx.codec import CodecSpec, decode, encode
from lynx.kvwire import KVShape, WireFormat

LAYERS, HEADS, DIM, POOL = 3, 2, 64, 300


def _pools(seed, dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(seed)
    return (
        [torch.randn(POOL, HEADS, DIM, generator=g).to(dtype) for _ in range(LAYERS)],
        [torch.randn(POOL, HEADS, DIM, generator=g).to(dtype) for _ in range(LAYERS)],
    )


def _slots(n, seed):
    return torch.randperm(POOL, generator=torch.Generator().manual_seed(seed))[:n]


@pytest.mark.parametrize("mode", ["bf16", "int8", "int4", "lynx"])
def test_streams_written_elsewhere_equal_a_direct_round_trip(mode):
    wire = WireFormat.for_mode(mode, "int8")
    src_k, src_v = _pools(0)
    src, dst = _slots(70, 1), _slots(70, 2)
    shape = KVShape(LAYERS, 70, HEADS, DIM, torch.bfloat16)
    streams = wire.encode(src_k, src_v, src)
    assert [int(s.numel()) for s in streams] == list(wire.stream_sizes(shape))
    dst_k, dst_v = _pools(3)
    wire.write(streams, shape, dst_k, dst_v, dst)
    for layer in range(LAYERS):
        if wire.spec is None:
            expect_k, expect_v = src_k[layer][src], src_v[layer][src]
        else:
            expect_k, expect_v = decode(encode(src_k[layer][src], src_v[layer][src], wire.spec))
        assert torch.equal(dst_k[layer][dst], expect_k)
        assert torch.equal(dst_v[layer][dst], expect_v)


def test_int8_mode_and_lynx_int8_preset_land_identical_kv():
    src_k, src_v = _pools(4)
    src, dst = _slots(90, 5), _slots(90, 6)
    shape = KVShape(LAYERS, 90, HEADS, DIM, torch.bfloat16)
    out = {}
    for mode in ("int8", "lynx"):
        wire = WireFormat.for_mode(mode, "int8")
        dst_k, dst_v = _pools(7)
        wire.write(wire.encode(src_k, src_v, src), shape, dst_k, dst_v, dst)
        out[mode] = [t[dst] for t in dst_k + dst_v]
    assert all(torch.equal(a, b) for a, b in zip(out["int8"], out["lynx"]))


@pytest.mark.parametrize("preset", ["int8", "2+6", "bf16-exact"])
def test_upgrade_after_anchor_equals_writing_every_stream(preset):
    wire = WireFormat.for_mode("lynx", preset)
    src_k, src_v = _pools(8)
    src, dst = _slots(65, 9), _slots(65, 10)
    shape = KVShape(LAYERS, 65, HEADS, DIM, torch.bfloat16)
    streams = wire.encode(src_k, src_v, src)
    full_k, full_v = _pools(11)
    wire.write(streams, shape, full_k, full_v, dst)
    up_k, up_v = _pools(11)
    wire.write(streams[:1], shape, up_k, up_v, dst)
    wire.upgrade(streams, shape, up_k, up_v, dst)
    assert all(torch.equal(a, b) for a, b in zip(full_k + full_v, up_k + up_v))


def test_upgrade_refuses_a_partial_residual():
    wire = WireFormat.for_mode("lynx", "int8")
    src_k, src_v = _pools(12)
    shape = KVShape(LAYERS, 10, HEADS, DIM, torch.bfloat16)
    streams = wire.encode(src_k, src_v, _slots(10, 13))
    with pytest.raises(ValueError, match="every stream"):
        wire.upgrade(streams[:1], shape, src_k, src_v, _slots(10, 14))


def test_unknown_mode_is_rejected():
    with pytest.raises(ValueError, match="unknown mode"):
        WireFormat.for_mode("fp8", "int8")


def test_int8_mode_is_one_stream_joining_the_int8_preset_streams_per_layer():
    wire, lynx = WireFormat.for_mode("int8", "int16"), WireFormat.for_mode("lynx", "int8")
    assert wire.num_streams == 1 and wire.spec == CodecSpec.preset("int8")
    src_k, src_v = _pools(16)
    src = _slots(70, 17)
    shape = KVShape(LAYERS, 70, HEADS, DIM, torch.bfloat16)
    [joined] = wire.encode(src_k, src_v, src)
    anchor, residual = lynx.encode(src_k, src_v, src)
    a_bounds, r_bounds = lynx.layer_bounds(shape)
    per_layer = [torch.cat([anchor[a_bounds[i] : a_bounds[i + 1]], residual[r_bounds[i] : r_bounds[i + 1]]])
                 for i in range(LAYERS)]
    assert torch.equal(joined, torch.cat(per_layer))
    assert wire.layer_bounds(shape)[0] == [sum(len(p) for p in per_layer[:i]) for i in range(LAYERS + 1)]


@pytest.mark.parametrize("mode", ["bf16", "lynx"])
def test_a_prompt_the_receiver_already_holds_sends_empty_streams(mode):
    wire = WireFormat.for_mode(mode, "int8")
    k, v = _pools(15)
    shape = KVShape(LAYERS, 0, HEADS, DIM, torch.bfloat16)
    streams = wire.encode(k, v, torch.empty(0, dtype=torch.int64))
    assert [s.numel() for s in streams] == [0] * wire.num_streams == list(wire.stream_sizes(shape))
    before = [t.clone() for t in k + v]
    wire.write(streams, shape, k, v, torch.empty(0, dtype=torch.int64))
    assert all(torch.equal(a, b) for a, b in zip(before, k + v))


@pytest.mark.parametrize("mode", ["bf16", "int8", "int4", "lynx"])
def test_segments_decode_exactly_like_one_whole_encoding(mode):
    wire = WireFormat.for_mode(mode, "int8")
    src_k, src_v = _pools(11)
    tokens = 290
    src, dst = _slots(tokens, 12), _slots(tokens, 13)
    shape = KVShape(LAYERS, tokens, HEADS, DIM, torch.bfloat16)
    whole_k, whole_v = _pools(14)
    wire.write(wire.encode(src_k, src_v, src), shape, whole_k, whole_v, dst)
    pieces = wire.segments(tokens, 128)
    assert len(pieces) == 3 and sum(n for _, n in pieces) == tokens
    seg_k, seg_v = _pools(14)
    for first, count in pieces:
        part = shape.segment(first, count)
        streams = wire.encode(src_k, src_v, src[first : first + count], first_token=first)
        assert [int(s.numel()) for s in streams] == list(wire.stream_sizes(part))
        wire.write(streams, part, seg_k, seg_v, dst[first : first + count])
    for layer in range(LAYERS):
        assert torch.equal(seg_k[layer][dst], whole_k[layer][dst])
        assert torch.equal(seg_v[layer][dst], whole_v[layer][dst])


def test_segment_boundaries_are_key_group_boundaries_at_or_before_each_chunk_end():
    """A segment must be complete when the prefill chunk it ends in is: with 4 sinks and key
    groups of 64, a chunk boundary at 128 tokens is preceded by the key boundary 68 (4 + 64)."""
    wire = WireFormat.for_mode("lynx", "int8")
    sinks, group = wire.spec.sink_tokens, wire.spec.key_group_tokens
    assert (sinks, group) == (4, 64)
    assert wire.segments(1000, 0) == [(0, 1000)]
    assert wire.segments(100, 128) == [(0, 100)]
    assert wire.segments(128, 128) == [(0, 128)]
    assert wire.segments(300, 128) == [(0, 68), (68, 128), (196, 104)]
    assert wire.segments(1072, 512) == [(0, 452), (452, 512), (964, 108)]
    for tokens in range(1, 1200, 37):
        pieces = wire.segments(tokens, 256)
        assert sum(n for _, n in pieces) == tokens and all(n > 0 for _, n in pieces)
        ends = [first + n for first, n in pieces]
        for k, end in enumerate(ends[:-1]):
            assert (end - sinks) % group == 0 and (k + 1) * 256 - group < end <= (k + 1) * 256
    assert WireFormat.for_mode("bf16", "int8").segments(300, 128) == [(0, 128), (128, 128), (256, 44)]
    with pytest.raises(ValueError, match="multiple of 64"):
        wire.segments(300, 100)


@pytest.mark.parametrize("mode", ["bf16", "int8", "int4", "lynx"])
def test_each_head_range_encodes_and_lands_exactly_as_its_heads_of_the_whole(mode):
    """Tensor parallelism re-slices heads: the KV of heads [1, 3) of a 4-head pool, encoded from a
    strided view and written into another 3-head pool's heads [0, 2), lands exactly what the whole
    pool's encoding lands in those heads (keys group per head and channel, values per token and head)."""
    wire = WireFormat.for_mode(mode, "int8")
    g = torch.Generator().manual_seed(11)
    src_k = [torch.randn(POOL, 4, DIM, generator=g).to(torch.bfloat16) for _ in range(LAYERS)]
    src_v = [torch.randn(POOL, 4, DIM, generator=g).to(torch.bfloat16) for _ in range(LAYERS)]
    src, dst = _slots(150, 12), _slots(150, 13)
    whole_k = [torch.zeros(POOL, 4, DIM, dtype=torch.bfloat16) for _ in range(LAYERS)]
    whole_v = [torch.zeros(POOL, 4, DIM, dtype=torch.bfloat16) for _ in range(LAYERS)]
    streams = wire.encode(src_k, src_v, src)
    wire.write(streams, KVShape(LAYERS, 150, 4, DIM, torch.bfloat16), whole_k, whole_v, dst)
    part_k = [torch.full((POOL, 3, DIM), 7.0, dtype=torch.bfloat16) for _ in range(LAYERS)]
    part_v = [torch.full((POOL, 3, DIM), 7.0, dtype=torch.bfloat16) for _ in range(LAYERS)]
    sliced = wire.encode([k[:, 1:3] for k in src_k], [v[:, 1:3] for v in src_v], src)
    shape = KVShape(LAYERS, 150, 2, DIM, torch.bfloat16)
    wire.write(sliced, shape, [k[:, :2] for k in part_k], [v[:, :2] for v in part_v], dst)
    for layer in range(LAYERS):
        assert torch.equal(part_k[layer][dst][:, :2], whole_k[layer][dst][:, 1:3])
        assert torch.equal(part_v[layer][dst][:, :2], whole_v[layer][dst][:, 1:3])
        assert bool((part_k[layer][:, 2] == 7).all() and (part_v[layer][:, 2] == 7).all()), "head 2 untouched"
    if wire.num_streams > 1:
        up_k = [t.clone() for t in part_k]
        up_v = [t.clone() for t in part_v]
        wire.upgrade(sliced, shape, [k[:, :2] for k in up_k], [v[:, :2] for v in up_v], dst)
        assert all(torch.equal(a, b) for a, b in zip(up_k + up_v, part_k + part_v)), "upgrade in a view is exact"
