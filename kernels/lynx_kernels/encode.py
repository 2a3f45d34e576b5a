"""Fused encode: gather K/V from the pool, quantize, code every stage, pack.

One launch per tensor writes the quantized tokens' part of the wire streams
of :func:`lynx.codec.encode` byte for byte: key programs own one token block
x head x channel chunk and its per-channel minima/scales; value programs own
a few tokens x head and their per-token channel-group minima/scales. The few
sink tokens are copied raw into the anchor by plain tensor ops. Same
signature as :func:`lynx.codec.pool.encode_from_pool`, the reference.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from lynx.codec.codec import EncodedKV
from lynx.codec.layout import num_key_groups, sink_count
from lynx.codec.pool_checks import check_pools
from lynx.codec.spec import CodecSpec
from lynx_kernels.bits import is_finite, ordered_max, ordered_min, round_down, round_up, to_float32
from lynx_kernels.plan import MAX_STAGES, TilePlan, WireOffsets, stage_widths, supports, triton_dtype
from lynx_kernels.stages import store_stages

NON_FINITE, OUT_OF_RANGE, PARAM_OVERFLOW = 1, 2, 4


@triton.jit
def _input_flags(x, mask, LIMIT: tl.constexpr):
    bad = tl.max((mask & ~is_finite(x)).to(tl.int32))
    wide = tl.max((mask & (tl.abs(x) > LIMIT)).to(tl.int32))
    return bad * 1 | wide * 2


@triton.jit
def _group_params(lo, hi, valid, LEVELS: tl.constexpr, SCALE: tl.constexpr):
    """Rounded (min, scale) in ``SCALE`` dtype and an overflow flag (4 or 0)."""
    mn = round_down(lo, SCALE)
    scale = round_up(tl.math.div_rn(hi - to_float32(mn), LEVELS * 1.0), SCALE)
    finite = is_finite(to_float32(mn)) & is_finite(to_float32(scale))
    return mn, scale, tl.max((valid & ~finite).to(tl.int32)) * 4


@triton.jit
def _position(x, mn, scale):
    """``(x - mn) / scale`` in anchor steps, 0 where ``scale == 0``."""
    positive = scale > 0
    return tl.where(positive, tl.math.div_rn(x - mn, tl.where(positive, scale, 1.0)), 0.0)


@triton.jit
def _encode_key_kernel(
    pool, slots_ptr, stride_p, stride_h, stride_d, T, H, D, params_ptr, min_at, scale_at,
    s0, s1, s2, s3, o0, o1, o2, o3, raw, errors,
    KG: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr, SCALE: tl.constexpr, LIMIT: tl.constexpr,
    W0: tl.constexpr, W1: tl.constexpr, W2: tl.constexpr, W3: tl.constexpr, RAW: tl.constexpr,
):
    group = tl.program_id(0)
    head = tl.program_id(1)
    col0 = tl.program_id(2) * BC
    offsets = tl.arange(0, BT)
    tokens = group * KG + offsets
    row_mask = (offsets < KG) & (tokens < T)
    cols = col0 + tl.arange(0, BC)
    col_mask = cols < D
    mask = row_mask[:, None] & col_mask[None, :]
    slots = tl.load(slots_ptr + tokens, mask=row_mask, other=0).to(tl.int64)
    src = tl.load(pool + slots[:, None] * stride_p + head * stride_h + cols[None, :] * stride_d, mask=mask, other=0)
    x = to_float32(src)
    LEVELS: tl.constexpr = (1 << W0) - 1
    lo = ordered_min(x, mask, 0)
    hi = ordered_max(x, mask, 0)
    mn, scale, overflow = _group_params(lo, hi, col_mask, LEVELS, SCALE)
    at = (group.to(tl.int64) * H + head) * D + cols
    tl.store(params_ptr + min_at + at, mn.to(tl.int16, bitcast=True), mask=col_mask)
    tl.store(params_ptr + scale_at + at, scale.to(tl.int16, bitcast=True), mask=col_mask)
    position = _position(x, to_float32(mn)[None, :], to_float32(scale)[None, :])
    rows = tokens.to(tl.int64) * H + head
    store_stages(position, rows, col0, D - col0, row_mask, D, s0, s1, s2, s3, o0, o1, o2, o3, W0, W1, W2, W3, BT, BC)
    if RAW:
        tl.store(raw + rows[:, None] * D + cols[None, :], src, mask=mask)
    flags = _input_flags(x, mask, LIMIT) | overflow
    tl.atomic_or(errors, flags, mask=flags != 0)


@triton.jit
def _encode_value_kernel(
    pool, slots_ptr, stride_p, stride_h, stride_d, T, H, D, params_ptr, min_at, scale_at,
    s0, s1, s2, s3, o0, o1, o2, o3, raw, errors,
    VG: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr, SCALE: tl.constexpr, LIMIT: tl.constexpr,
    W0: tl.constexpr, W1: tl.constexpr, W2: tl.constexpr, W3: tl.constexpr, RAW: tl.constexpr,
):
    head = tl.program_id(1)
    tokens = tl.program_id(0) * BT + tl.arange(0, BT)
    row_mask = tokens < T
    cols = tl.arange(0, BC)
    mask = row_mask[:, None] & (cols < D)[None, :]
    slots = tl.load(slots_ptr + tokens, mask=row_mask, other=0).to(tl.int64)
    src = tl.load(pool + slots[:, None] * stride_p + head * stride_h + cols[None, :] * stride_d, mask=mask, other=0)
    x = to_float32(src)
    LEVELS: tl.constexpr = (1 << W0) - 1
    NG: tl.constexpr = BC // VG
    grouped = tl.reshape(x, [BT, NG, VG])
    grouped_mask = tl.reshape(mask, [BT, NG, VG])
    lo = ordered_min(grouped, grouped_mask, 2)
    hi = ordered_max(grouped, grouped_mask, 2)
    groups = tl.arange(0, NG)
    group_mask = row_mask[:, None] & (groups < D // VG)[None, :]
    mn, scale, overflow = _group_params(lo, hi, group_mask, LEVELS, SCALE)
    rows = tokens.to(tl.int64) * H + head
    at = rows[:, None] * (D // VG) + groups[None, :]
    tl.store(params_ptr + min_at + at, mn.to(tl.int16, bitcast=True), mask=group_mask)
    tl.store(params_ptr + scale_at + at, scale.to(tl.int16, bitcast=True), mask=group_mask)
    mn_full = tl.reshape(tl.broadcast_to(to_float32(mn)[:, :, None], [BT, NG, VG]), [BT, BC])
    scale_full = tl.reshape(tl.broadcast_to(to_float32(scale)[:, :, None], [BT, NG, VG]), [BT, BC])
    position = _position(x, mn_full, scale_full)
    store_stages(position, rows, 0, D, row_mask, D, s0, s1, s2, s3, o0, o1, o2, o3, W0, W1, W2, W3, BT, BC)
    if RAW:
        tl.store(raw + rows[:, None] * D + cols[None, :], src, mask=mask)
    flags = _input_flags(x, mask, LIMIT) | overflow
    tl.atomic_or(errors, flags, mask=flags != 0)


def encode_from_pool(
    k_pool: torch.Tensor, v_pool: torch.Tensor, token_indices: torch.Tensor, spec: CodecSpec
) -> EncodedKV:
    """Triton twin of :func:`lynx.codec.pool.encode_from_pool`, byte-identical streams.

    Args:
        k_pool, v_pool: ``[pool_size, kv_heads, head_dim]`` float16/bfloat16/
            float32, any strides, on CUDA (or CPU under ``TRITON_INTERPRET=1``).
        token_indices: ``[T]`` int64/int32 slots in ``[0, pool_size)``.
        spec: codec configuration; :func:`lynx_kernels.supports` must accept it.

    Returns:
        EncodedKV with all ``spec.num_stages`` streams, on the pools' device.
    """
    check_pools(k_pool, v_pool, token_indices)
    if not supports(spec, k_pool.shape[2]):
        raise ValueError(f"the kernels do not handle {spec} with head_dim {k_pool.shape[2]}; use the reference")
    encoded, errors = launch_encode(k_pool, v_pool, token_indices, spec)
    raise_on_flags(errors, spec)
    return encoded


def launch_encode(
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    token_indices: torch.Tensor,
    spec: CodecSpec,
    plan: TilePlan | None = None,
) -> tuple[EncodedKV, torch.Tensor]:
    """Launch the encode kernels without validating or waiting for them.

    For callers that validated the pools, indices and spec already (once per
    request rather than per layer) and for benchmarks. Returns the encoded
    streams and int32 ``[2]`` flags (key, value), nonzero where the input was
    not encodable; the streams are meaningless unless :func:`raise_on_flags`
    passes. ``plan``: the tiles (default ``TilePlan.for_shape``; benchmarks try others).
    """
    _, heads, head_dim = k_pool.shape
    tokens = token_indices.numel()
    device = k_pool.device
    streams = [
        torch.empty(size, dtype=torch.uint8, device=device)
        for size in spec.stream_bytes(tokens, heads, head_dim, k_pool.dtype)
    ]
    offsets = WireOffsets.for_shape(spec, tokens, heads, head_dim, k_pool.dtype)
    errors = torch.zeros(2, dtype=torch.int32, device=device)
    limit = torch.finfo(spec.torch_scale_dtype).max
    sinks = sink_count(spec, tokens)
    if sinks:
        for index, (pool, start) in enumerate(((k_pool, offsets.sink_keys), (v_pool, offsets.sink_values))):
            _copy_sinks(pool, token_indices[:sinks], streams[0], start, errors[index : index + 1], limit)
    if sinks < tokens:
        plan = plan or TilePlan.for_shape(spec, head_dim)
        _launch_quantize(k_pool, v_pool, token_indices[sinks:], spec, streams, offsets, errors, plan)
    return EncodedKV(spec, tuple(streams), tokens, heads, head_dim, k_pool.dtype), errors


def _copy_sinks(
    pool: torch.Tensor, slots: torch.Tensor, anchor: torch.Tensor, start: int, flags: torch.Tensor, limit: float
) -> None:
    """Raw bytes of the sink tokens' rows into the anchor at ``start``; their problems into ``flags``."""
    rows = pool[slots]
    data = rows.contiguous().view(torch.uint8).reshape(-1)
    anchor[start : start + data.numel()] = data
    values = rows.float()
    flags |= (~torch.isfinite(values)).any().int() * NON_FINITE | (values.abs() > limit).any().int() * OUT_OF_RANGE


def _launch_quantize(
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    slots: torch.Tensor,
    spec: CodecSpec,
    streams: list[torch.Tensor],
    offsets: WireOffsets,
    errors: torch.Tensor,
    plan: TilePlan,
) -> None:
    """The key and value kernels over the quantized tokens, at ``slots``."""
    _, heads, head_dim = k_pool.shape
    tokens = slots.numel()
    params_ptr = streams[0][: offsets.key_codes[0]].view(torch.int16)
    quantized = spec.num_quantized_stages
    code_streams = (*streams[:quantized], *(streams[0],) * (MAX_STAGES - quantized))
    elements = tokens * heads * head_dim
    raw = streams[-1].view(k_pool.dtype) if spec.raw_residual else None
    raw_key, raw_value = (raw[:elements], raw[elements:]) if raw is not None else (k_pool, v_pool)
    scale_dtype = spec.torch_scale_dtype
    options = {
        "BC": plan.key_channels,
        "SCALE": triton_dtype(scale_dtype),
        "LIMIT": torch.finfo(scale_dtype).max,
        "RAW": spec.raw_residual,
        **dict(zip(("W0", "W1", "W2", "W3"), stage_widths(spec, quantized))),
        "enable_fp_fusion": False,
        "num_warps": plan.warps,
    }
    key_grid = (num_key_groups(spec, tokens), heads, triton.cdiv(head_dim, plan.key_channels))
    _encode_key_kernel[key_grid](
        k_pool, slots, *k_pool.stride(), tokens, heads, head_dim,
        params_ptr, offsets.key_min // 2, offsets.key_scale // 2, *code_streams, *offsets.key_codes,
        raw_key, errors[0:1], KG=spec.key_group_tokens, BT=plan.key_tokens, **options,
    )
    options["BC"] = plan.value_channels
    value_grid = (triton.cdiv(tokens, plan.value_tokens), heads)
    _encode_value_kernel[value_grid](
        v_pool, slots, *v_pool.stride(), tokens, heads, head_dim,
        params_ptr, offsets.value_min // 2, offsets.value_scale // 2, *code_streams, *offsets.value_codes,
        raw_value, errors[1:2], VG=spec.value_group_channels, BT=plan.value_tokens, **options,
    )


def raise_on_flags(errors: torch.Tensor, spec: CodecSpec) -> None:
    """Raise the reference's ValueError for the first problem :func:`launch_encode` flagged, keys first."""
    for name, flags in zip(("key", "value"), errors.tolist()):
        if flags & NON_FINITE:
            raise ValueError(f"{name} contains NaN or infinite values; the codec only encodes finite tensors")
        if flags & OUT_OF_RANGE:
            limit = torch.finfo(spec.torch_scale_dtype).max
            raise ValueError(f"{name} has values beyond +-{limit}, the range of scale_dtype {spec.scale_dtype}")
        if flags & PARAM_OVERFLOW:
            raise ValueError(
                f"{name} group minimum or scale overflows scale_dtype {spec.scale_dtype}; "
                "the value range is too wide for it"
            )
