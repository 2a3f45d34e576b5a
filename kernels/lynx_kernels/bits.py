"""Triton device helpers: directed rounding to 16-bit floats and dense bit (un)packing.

They mirror :mod:`lynx.codec.rounding` and :mod:`lynx.codec.bitpack`. A tile
of codes is ``[BT, BC]``: ``BT`` rows (one row = one token of one head) by
``BC`` consecutive channels starting at a byte-aligned bit position, so each
row's packed bytes can be written without touching a neighbour's.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def to_float32(x):
    """Exact float32 of a float16/bfloat16/float32 tensor (bfloat16 by its bits,
    as ``TRITON_INTERPRET=1`` converts bfloat16 with its own, inexact, routine).
    """
    if x.dtype == tl.bfloat16:
        return (x.to(tl.uint16, bitcast=True).to(tl.uint32) << 16).to(tl.float32, bitcast=True)
    else:
        return x.to(tl.float32)


@triton.jit
def from_float32(x, DTYPE: tl.constexpr):
    """float32 ``x`` rounded to the nearest ``DTYPE`` value, ties to even.

    bfloat16 is rounded by integer arithmetic on the bits because
    ``TRITON_INTERPRET=1`` truncates float32 to bfloat16 instead of rounding.
    """
    if DTYPE == tl.bfloat16:
        bits = x.to(tl.uint32, bitcast=True)
        bits = bits + (0x7FFF + ((bits >> 16) & 1))
        return (bits >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True)
    else:
        return x.to(DTYPE)


@triton.jit
def round_down(x, DTYPE: tl.constexpr):
    """Largest ``DTYPE`` value ``<= x`` (float32 ``x``), as ``DTYPE``."""
    rounded = from_float32(x, DTYPE)
    bits = rounded.to(tl.int16, bitcast=True).to(tl.int32)
    down = tl.where(bits == 0, -32767, bits - 1)
    down = tl.where(bits < 0, bits + 1, down)
    stepped = down.to(tl.int16).to(DTYPE, bitcast=True)
    return tl.where(to_float32(rounded) > x, stepped, rounded)


@triton.jit
def round_up(x, DTYPE: tl.constexpr):
    """Smallest ``DTYPE`` value ``>= x`` (float32 ``x``), as ``DTYPE``."""
    rounded = from_float32(x, DTYPE)
    bits = rounded.to(tl.int16, bitcast=True).to(tl.int32)
    up = tl.where(bits == -32768, 1, bits - 1)
    up = tl.where(bits >= 0, bits + 1, up)
    stepped = up.to(tl.int16).to(DTYPE, bitcast=True)
    return tl.where(to_float32(rounded) < x, stepped, rounded)


@triton.jit
def is_finite(x):
    """Elementwise: ``x`` (float32) is neither NaN nor infinite."""
    return (x == x) & (tl.abs(x) != float("inf"))


@triton.jit
def _order_key(bits):
    """Map float32 bits (int32) to int32 keys ordered as the floats, ``-0.0 < +0.0``; an involution."""
    return bits ^ ((bits >> 31) & 0x7FFFFFFF)


@triton.jit
def ordered_min(x, mask, AXIS: tl.constexpr):
    """Minimum of float32 ``x`` where ``mask`` along ``AXIS``, with ``-0.0 < +0.0``
    so the sign of a zero minimum does not depend on reduction order; NaN
    where the mask selects nothing.
    """
    key = tl.min(tl.where(mask, _order_key(x.to(tl.int32, bitcast=True)), 0x7FFFFFFF), axis=AXIS)
    return _order_key(key).to(tl.float32, bitcast=True)


@triton.jit
def ordered_max(x, mask, AXIS: tl.constexpr):
    """Maximum counterpart of :func:`ordered_min` (``+0.0 > -0.0``)."""
    key = tl.max(tl.where(mask, _order_key(x.to(tl.int32, bitcast=True)), -0x80000000), axis=AXIS)
    return _order_key(key).to(tl.float32, bitcast=True)


@triton.jit
def load_half(ptr, index, mask, DTYPE: tl.constexpr):
    """float32 of the ``DTYPE`` stored little-endian at bytes ``2*index`` of ``ptr`` (uint8)."""
    low = tl.load(ptr + 2 * index, mask=mask, other=0).to(tl.int32)
    high = tl.load(ptr + 2 * index + 1, mask=mask, other=0).to(tl.int32)
    return to_float32((low | (high << 8)).to(tl.int16).to(DTYPE, bitcast=True))


@triton.jit
def pack_store(codes, ptr, row_bytes, row_mask, num_cols, W: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr):
    """Pack ``codes`` ``[BT, BC]`` (int32, ``W`` bits) LSB-first into ``ptr``.

    Row ``i`` starts at byte ``row_bytes[i]`` (int64). Codes go in periods of
    ``P = 8 / gcd(W, 8)`` that fill ``B = W / gcd(W, 8)`` bytes; the first
    ``num_cols`` columns (a multiple of ``P``) of rows in ``row_mask`` are written.
    """
    G: tl.constexpr = 8 if W % 8 == 0 else (4 if W % 4 == 0 else (2 if W % 2 == 0 else 1))
    P: tl.constexpr = 8 // G
    B: tl.constexpr = W // G
    J: tl.constexpr = BC // P
    periods = tl.arange(0, J)
    mask = row_mask[:, None] & (periods[None, :] * P < num_cols)
    base = ptr + row_bytes[:, None] + periods[None, :] * B
    if P == 1:
        for b in tl.static_range(B):
            tl.store(base + b, ((codes >> (8 * b)) & 0xFF).to(tl.uint8), mask=mask)
    else:
        grouped = tl.reshape(codes, [BT, J, P])
        lanes = tl.arange(0, P)[None, None, :]
        for b in tl.static_range(B):
            byte = tl.zeros([BT, J], dtype=tl.int32)
            for k in tl.static_range(P):
                if k * W < 8 * b + 8:
                    if k * W + W > 8 * b:
                        code = tl.sum(tl.where(lanes == k, grouped, 0), axis=2)
                        if k * W >= 8 * b:
                            byte = byte | (code << (k * W - 8 * b))
                        else:
                            byte = byte | (code >> (8 * b - k * W))
            tl.store(base + b, (byte & 0xFF).to(tl.uint8), mask=mask)


@triton.jit
def load_codes(ptr, row_bytes, cols, mask, W: tl.constexpr):
    """Unpack ``W``-bit codes ``[BT, BC]`` int32: row ``i`` starts at byte
    ``row_bytes[i]`` (int64), column ``j`` is code ``cols[j]`` of the row.
    """
    bit = cols * W
    byte = ptr + row_bytes[:, None] + (bit >> 3)[None, :]
    shift = (bit & 7)[None, :]
    word = tl.load(byte, mask=mask, other=0).to(tl.int32)
    if W > 1:
        word = word | (tl.load(byte + 1, mask=mask & (shift + W > 8), other=0).to(tl.int32) << 8)
    if W > 9:
        word = word | (tl.load(byte + 2, mask=mask & (shift + W > 16), other=0).to(tl.int32) << 16)
    return (word >> shift) & ((1 << W) - 1)
