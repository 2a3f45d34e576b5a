"""Triton device helpers for the hierarchical stages of :mod:`lynx.codec.stages`.

A cell is three float32 tiles (level, width, side) exactly as in the
reference's ``Cell``; every function repeats the reference's float32
operations in the same order (divisions rounded to nearest, launched with
``enable_fp_fusion=False``), so codes and levels agree bit for bit.
Stage widths ``W0..W3`` are compile-time constants, 0 for an absent stage.
"""

from __future__ import annotations

import triton
import triton.language as tl

from lynx_kernels.bits import load_codes, pack_store


@triton.jit
def anchor_cell(codes, TOP: tl.constexpr):
    """(level, width, side) left by anchor ``codes`` (int32) of a grid ``0..TOP``."""
    side = tl.where(codes == 0, 1.0, tl.where(codes == TOP, -1.0, 0.0))
    return codes.to(tl.float32), tl.where(side == 0, 1.0, 0.5), side


@triton.jit
def _step(width, side, N: tl.constexpr):
    centred = width * (1.0 / N)
    sided = tl.math.div_rn(width + width, 2.0 * N - 1.0)
    return tl.where(side == 0, centred, sided)


@triton.jit
def refine_codes(position, level, width, side, N: tl.constexpr):
    """int32 index of the sub-cell, of ``N`` in the cell, that holds ``position``."""
    step = _step(width, side, N)
    offset = position - level
    offset = tl.where(side == 0, offset, side * offset)
    bias = tl.where(side == 0, N / 2, 0.5)
    index = tl.floor(tl.math.div_rn(offset, step) + bias)
    return tl.minimum(tl.maximum(index, 0.0), N - 1.0).to(tl.int32)


@triton.jit
def refine(level, width, side, codes, N: tl.constexpr):
    """The (level, width, side) that stage ``codes`` of ``N`` sub-cells leave inside the cell."""
    step = _step(width, side, N)
    index = codes.to(tl.float32)
    centred = (index - (N - 1) / 2) * step
    sided = side * (index * step)
    level = level + tl.where(side == 0, centred, sided)
    first = codes == 0
    width = tl.where((side != 0) & first, step * 0.5, step)
    return level, width, tl.where(first, side, 0.0)


@triton.jit
def store_stages(
    position, rows, col0, num_cols, row_mask, D, s0, s1, s2, s3, o0, o1, o2, o3,
    W0: tl.constexpr, W1: tl.constexpr, W2: tl.constexpr, W3: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr,
):
    """Code ``position`` ``[BT, BC]`` (float32, in anchor steps) in every stage
    and pack stage ``s`` (width ``Ws``) at byte offset ``os`` of stream ``ss``.

    ``rows`` ``[BT]`` int64 are flat row indices ``token * kv_heads + head``
    of rows ``D`` codes long; the tile starts at column ``col0``.
    """
    TOP: tl.constexpr = (1 << W0) - 1
    first = rows * D + col0
    codes = tl.minimum(tl.maximum(tl.floor(position + 0.5), 0.0), TOP * 1.0).to(tl.int32)
    pack_store(codes, s0, o0 + first * W0 // 8, row_mask, num_cols, W0, BT, BC)
    if W1 > 0:
        level, width, side = anchor_cell(codes, TOP)
        codes = refine_codes(position, level, width, side, 1 << W1)
        pack_store(codes, s1, o1 + first * W1 // 8, row_mask, num_cols, W1, BT, BC)
        if W2 > 0:
            level, width, side = refine(level, width, side, codes, 1 << W1)
            codes = refine_codes(position, level, width, side, 1 << W2)
            pack_store(codes, s2, o2 + first * W2 // 8, row_mask, num_cols, W2, BT, BC)
            if W3 > 0:
                level, width, side = refine(level, width, side, codes, 1 << W2)
                codes = refine_codes(position, level, width, side, 1 << W3)
                pack_store(codes, s3, o3 + first * W3 // 8, row_mask, num_cols, W3, BT, BC)


@triton.jit
def load_level(
    rows, col0, cols, mask, D, s0, s1, s2, s3, o0, o1, o2, o3,
    W0: tl.constexpr, W1: tl.constexpr, W2: tl.constexpr, W3: tl.constexpr,
):
    """Decoded float32 level ``[BT, BC]`` of the received stages (widths
    ``Ws``, 0 when not received); arguments as in :func:`store_stages`,
    ``cols`` the tile's column offsets from ``col0``.
    """
    first = rows * D + col0
    codes = load_codes(s0, o0 + first * W0 // 8, cols, mask, W0)
    level, width, side = anchor_cell(codes, (1 << W0) - 1)
    if W1 > 0:
        codes = load_codes(s1, o1 + first * W1 // 8, cols, mask, W1)
        level, width, side = refine(level, width, side, codes, 1 << W1)
    if W2 > 0:
        codes = load_codes(s2, o2 + first * W2 // 8, cols, mask, W2)
        level, width, side = refine(level, width, side, codes, 1 << W2)
    if W3 > 0:
        codes = load_codes(s3, o3 + first * W3 // 8, cols, mask, W3)
        level, width, side = refine(level, width, side, codes, 1 << W3)
    return level
