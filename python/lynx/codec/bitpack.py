"""Dense LSB-first bit packing of fixed-width unsigned codes.

Code ``i`` of width ``w`` occupies bits ``[i*w, (i+1)*w)`` of a little-endian
bit stream, where stream bit ``j`` is bit ``j % 8`` of byte ``j // 8``. So two
4-bit codes share a byte (first code in the low nibble) and two 12-bit codes
fill three bytes. ``count`` codes take ``ceil(count * w / 8)`` bytes.

Codes are processed in periods of ``8 / gcd(w, 8)`` codes, which fill exactly
``w / gcd(w, 8)`` bytes; the loops below run over that small period, never
over elements.
"""

from __future__ import annotations

import math

import torch

from lynx.codec.layout import packed_bytes

MAX_WIDTH = 16
_INT_DTYPES = (torch.uint8, torch.int16, torch.int32, torch.int64)


def pack_bits(codes: torch.Tensor, width: int) -> torch.Tensor:
    """Pack ``width``-bit codes densely, LSB first.

    Args:
        codes: ``[n]`` integer tensor (uint8, int16, int32 or int64) with
            values in ``[0, 2^width)``. int16 codes are read as unsigned
            16-bit words, so 16-bit codes fit.
        width: bits per code, 1..16.

    Returns:
        ``[ceil(n * width / 8)]`` uint8 tensor on the same device.
    """
    _check_width(width)
    if codes.dim() != 1:
        raise ValueError(f"codes must be 1-D, got shape {tuple(codes.shape)}")
    if codes.dtype not in _INT_DTYPES:
        raise ValueError(f"codes must have an integer dtype in {_INT_DTYPES}, got {codes.dtype}")
    values = codes.to(torch.int32)
    if codes.dtype == torch.int16:
        values = values & 0xFFFF
    count = values.numel()
    if count and (int(values.min()) < 0 or int(values.max()) >= 1 << width):
        raise ValueError(f"codes must lie in [0, {1 << width}) for width {width}")
    codes_per_period, bytes_per_period = _period(width)
    periods = -(-count // codes_per_period)
    padded = torch.zeros(periods * codes_per_period, dtype=torch.int32, device=values.device)
    padded[:count] = values
    padded = padded.view(periods, codes_per_period)
    out = torch.zeros(periods, bytes_per_period, dtype=torch.int32, device=values.device)
    for k in range(codes_per_period):
        first_bit = k * width
        for b in range(first_bit // 8, (first_bit + width - 1) // 8 + 1):
            shift = first_bit - 8 * b
            part = padded[:, k] << shift if shift >= 0 else padded[:, k] >> -shift
            out[:, b] |= part & 0xFF
    return out.view(-1)[: packed_bytes(count, width)].to(torch.uint8)


def unpack_bits(buf: torch.Tensor, width: int, count: int) -> torch.Tensor:
    """Inverse of :func:`pack_bits`.

    Args:
        buf: ``[m]`` uint8 tensor with ``m >= ceil(count * width / 8)``;
            bytes past that length are ignored.
        width: bits per code, 1..16.
        count: number of codes to read.

    Returns:
        ``[count]`` int32 tensor of codes in ``[0, 2^width)``.
    """
    _check_width(width)
    if buf.dim() != 1 or buf.dtype != torch.uint8:
        raise ValueError(f"buf must be a 1-D uint8 tensor, got {buf.dtype} of shape {tuple(buf.shape)}")
    if not isinstance(count, int) or count < 0:
        raise ValueError(f"count must be a non-negative int, got {count!r}")
    needed = packed_bytes(count, width)
    if buf.numel() < needed:
        raise ValueError(f"{count} codes of {width} bits need {needed} bytes, buffer holds {buf.numel()}")
    codes_per_period, bytes_per_period = _period(width)
    periods = -(-count // codes_per_period)
    padded = torch.zeros(periods * bytes_per_period, dtype=torch.int32, device=buf.device)
    padded[:needed] = buf[:needed].to(torch.int32)
    padded = padded.view(periods, bytes_per_period)
    out = torch.zeros(periods, codes_per_period, dtype=torch.int32, device=buf.device)
    for k in range(codes_per_period):
        first_bit = k * width
        for b in range(first_bit // 8, (first_bit + width - 1) // 8 + 1):
            shift = 8 * b - first_bit
            out[:, k] |= padded[:, b] << shift if shift >= 0 else padded[:, b] >> -shift
    return (out & ((1 << width) - 1)).view(-1)[:count]


def _period(width: int) -> tuple[int, int]:
    common = math.gcd(width, 8)
    return 8 // common, width // common


def _check_width(width: int) -> None:
    if not isinstance(width, int) or isinstance(width, bool) or not 1 <= width <= MAX_WIDTH:
        raise ValueError(f"width must be an int in 1..{MAX_WIDTH}, got {width!r}")
