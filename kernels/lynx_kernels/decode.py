"""Fused decode: unpack the received stages, dequantize, scatter into pool slots.

Programs tile tokens x channels of one head like the encode kernels. Values
are computed in float32 exactly as :func:`lynx.codec.decode` does (the level
of the received stages, then ``min + scale * level`` with no fused
multiply-add), rounded to the encoded dtype, then to the pool dtype. The few
sink tokens are scattered from the anchor's raw bytes by plain tensor ops.
Same signatures as
:func:`lynx.codec.pool.decode_into_pool` and
:func:`lynx.codec.pool.upgrade_in_pool`, the references.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from lynx.codec.codec import EncodedKV
from lynx.codec.layout import num_key_groups, sink_count
from lynx.codec.pool_checks import check_decode_target, check_upgrade
from lynx_kernels.bits import from_float32, load_half, to_float32
from lynx_kernels.plan import MAX_STAGES, TilePlan, WireOffsets, stage_widths, supports, triton_dtype
from lynx_kernels.stages import load_level


@triton.jit
def _decode_key_kernel(
    pool, slots_ptr, stride_p, stride_h, stride_d, T, H, D, anchor, min_at, scale_at,
    s0, s1, s2, s3, o0, o1, o2, o3, raw,
    KG: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr, SCALE: tl.constexpr, ENC: tl.constexpr,
    W0: tl.constexpr, W1: tl.constexpr, W2: tl.constexpr, W3: tl.constexpr,
    RAW: tl.constexpr,
):
    group = tl.program_id(0)
    head = tl.program_id(1)
    col0 = tl.program_id(2) * BC
    offsets = tl.arange(0, BT)
    tokens = group * KG + offsets
    row_mask = (offsets < KG) & (tokens < T)
    local = tl.arange(0, BC)
    cols = col0 + local
    col_mask = cols < D
    mask = row_mask[:, None] & col_mask[None, :]
    rows = tokens.to(tl.int64) * H + head
    if RAW:
        values = tl.load(raw + rows[:, None] * D + cols[None, :], mask=mask, other=0)
    else:
        at = (group.to(tl.int64) * H + head) * D + cols
        mn = load_half(anchor + min_at, at, col_mask, SCALE)
        scale = load_half(anchor + scale_at, at, col_mask, SCALE)
        level = load_level(rows, col0, local, mask, D, s0, s1, s2, s3, o0, o1, o2, o3, W0, W1, W2, W3)
        values = from_float32(mn[None, :] + scale[None, :] * level, ENC)
    slots = tl.load(slots_ptr + tokens, mask=row_mask, other=0).to(tl.int64)
    out = pool + slots[:, None] * stride_p + head * stride_h + cols[None, :] * stride_d
    tl.store(out, from_float32(to_float32(values), pool.dtype.element_ty), mask=mask)


@triton.jit
def _decode_value_kernel(
    pool, slots_ptr, stride_p, stride_h, stride_d, T, H, D, anchor, min_at, scale_at,
    s0, s1, s2, s3, o0, o1, o2, o3, raw,
    VG: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr, SCALE: tl.constexpr, ENC: tl.constexpr,
    W0: tl.constexpr, W1: tl.constexpr, W2: tl.constexpr, W3: tl.constexpr,
    RAW: tl.constexpr,
):
    head = tl.program_id(1)
    tokens = tl.program_id(0) * BT + tl.arange(0, BT)
    row_mask = tokens < T
    cols = tl.arange(0, BC)
    mask = row_mask[:, None] & (cols < D)[None, :]
    rows = tokens.to(tl.int64) * H + head
    if RAW:
        values = tl.load(raw + rows[:, None] * D + cols[None, :], mask=mask, other=0)
    else:
        NG: tl.constexpr = BC // VG
        groups = tl.arange(0, NG)
        group_mask = row_mask[:, None] & (groups < D // VG)[None, :]
        at = rows[:, None] * (D // VG) + groups[None, :]
        mn = load_half(anchor + min_at, at, group_mask, SCALE)
        scale = load_half(anchor + scale_at, at, group_mask, SCALE)
        mn_full = tl.reshape(tl.broadcast_to(mn[:, :, None], [BT, NG, VG]), [BT, BC])
        scale_full = tl.reshape(tl.broadcast_to(scale[:, :, None], [BT, NG, VG]), [BT, BC])
        level = load_level(rows, 0, cols, mask, D, s0, s1, s2, s3, o0, o1, o2, o3, W0, W1, W2, W3)
        values = from_float32(mn_full + scale_full * level, ENC)
    slots = tl.load(slots_ptr + tokens, mask=row_mask, other=0).to(tl.int64)
    out = pool + slots[:, None] * stride_p + head * stride_h + cols[None, :] * stride_d
    tl.store(out, from_float32(to_float32(values), pool.dtype.element_ty), mask=mask)


def decode_into_pool(
    encoded: EncodedKV,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    token_indices: torch.Tensor,
    stages: int | None = None,
) -> None:
    """Triton twin of :func:`lynx.codec.pool.decode_into_pool`, bit-identical slots.

    Args:
        encoded: streams of ``T`` tokens of ``[kv_heads, head_dim]``, on the
            pools' device; :func:`lynx_kernels.supports` must accept its spec.
        k_pool, v_pool: ``[pool_size, kv_heads, head_dim]``, written in place.
        token_indices: ``[T]`` distinct int64/int32 slots in ``[0, pool_size)``.
        stages: streams to use, ``1..len(encoded.streams)``; default all.
    """
    check_decode_target(encoded, k_pool, v_pool, token_indices)
    available = encoded.num_received_stages
    count = available if stages is None else stages
    if not isinstance(count, int) or isinstance(count, bool) or not 1 <= count <= available:
        raise ValueError(f"stages must be an int in 1..{available} (streams present), got {stages!r}")
    spec, head_dim = encoded.spec, encoded.head_dim
    if not supports(spec, head_dim):
        raise ValueError(f"the kernels do not handle {spec} with head_dim {head_dim}; use the reference")
    launch_decode(encoded, k_pool, v_pool, token_indices, count)


def launch_decode(
    encoded: EncodedKV,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    token_indices: torch.Tensor,
    count: int,
    plan: TilePlan | None = None,
) -> None:
    """Launch the decode kernels for the first ``count`` streams without validating anything.

    For callers that validated the request once already, and for benchmarks;
    :func:`decode_into_pool` is the checked entry point. ``plan``: the tiles
    (default ``TilePlan.for_shape``; benchmarks try others).
    """
    spec, dtype = encoded.spec, encoded.dtype
    tokens, heads, head_dim = encoded.num_tokens, encoded.kv_heads, encoded.head_dim
    streams = [stream.contiguous() for stream in encoded.streams[:count]]
    offsets = WireOffsets.for_shape(spec, tokens, heads, head_dim, dtype)
    sinks = sink_count(spec, tokens)
    if sinks:
        sink_bytes = sinks * heads * head_dim * dtype.itemsize
        for pool, start in ((k_pool, offsets.sink_keys), (v_pool, offsets.sink_values)):
            rows = _typed(streams[0][start : start + sink_bytes], dtype).reshape(sinks, heads, head_dim)
            pool[token_indices[:sinks]] = rows.to(pool.dtype)
    if sinks < tokens:
        plan = plan or TilePlan.for_shape(spec, head_dim)
        _launch_dequantize(encoded, streams, offsets, k_pool, v_pool, token_indices[sinks:], plan)


def _launch_dequantize(
    encoded: EncodedKV,
    streams: list[torch.Tensor],
    offsets: WireOffsets,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    slots: torch.Tensor,
    plan: TilePlan,
) -> None:
    """The key and value kernels over the quantized tokens, into ``slots``."""
    spec, count = encoded.spec, len(streams)
    tokens, heads, head_dim = slots.numel(), encoded.kv_heads, encoded.head_dim
    use_raw = spec.raw_residual and count == spec.num_stages
    quantized = min(count, spec.num_quantized_stages)
    code_streams = (*streams[:quantized], *(streams[0],) * (MAX_STAGES - quantized))
    if use_raw:
        raw = _typed(streams[-1], encoded.dtype)
        raw_key, raw_value = raw[: raw.numel() // 2], raw[raw.numel() // 2 :]
    else:
        raw_key, raw_value = k_pool, v_pool
    options = {
        "BC": plan.key_channels,
        "SCALE": triton_dtype(spec.torch_scale_dtype),
        "ENC": triton_dtype(encoded.dtype),
        "RAW": use_raw,
        **dict(zip(("W0", "W1", "W2", "W3"), stage_widths(spec, quantized))),
        "enable_fp_fusion": False,
        "num_warps": plan.warps,
    }
    key_grid = (num_key_groups(spec, tokens), heads, triton.cdiv(head_dim, plan.key_channels))
    _decode_key_kernel[key_grid](
        k_pool, slots, *k_pool.stride(), tokens, heads, head_dim,
        streams[0], offsets.key_min, offsets.key_scale, *code_streams, *offsets.key_codes,
        raw_key, KG=spec.key_group_tokens, BT=plan.key_tokens, **options,
    )
    options["BC"] = plan.value_channels
    value_grid = (triton.cdiv(tokens, plan.value_tokens), heads)
    _decode_value_kernel[value_grid](
        v_pool, slots, *v_pool.stride(), tokens, heads, head_dim,
        streams[0], offsets.value_min, offsets.value_scale, *code_streams, *offsets.value_codes,
        raw_value, VG=spec.value_group_channels, BT=plan.value_tokens, **options,
    )


def upgrade_in_pool(
    encoded: EncodedKV, k_pool: torch.Tensor, v_pool: torch.Tensor, token_indices: torch.Tensor
) -> None:
    """Triton twin of :func:`lynx.codec.pool.upgrade_in_pool`.

    Like the reference it recomputes every value from the codes of every
    stage (a full decode of all present streams) rather than
    adding a delta to the anchor-only values the slots hold, so the slots end
    bit-identical to a full :func:`decode_into_pool`.

    Args:
        encoded: at least two streams (anchor plus residual).
        k_pool, v_pool, token_indices: as in :func:`decode_into_pool`.
    """
    check_upgrade(encoded)
    decode_into_pool(encoded, k_pool, v_pool, token_indices)


def _typed(data: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Bytes ``data`` (uint8) viewed as ``dtype``, copied first if they do not start aligned for it."""
    if data.storage_offset() % dtype.itemsize:
        data = data.clone()
    return data.view(dtype)
