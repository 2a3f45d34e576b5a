"""Directed rounding of float32 tensors to a 16-bit float dtype.

The encoder rounds each group minimum down and each scale up, so the grid
``min + scale * [0, 2^b - 1]`` the receiver rebuilds always covers the group.
"""

from __future__ import annotations

import torch

_NEGATIVE_ZERO = -32768
_SMALLEST_NEGATIVE = -32767


def divide(x: torch.Tensor, divisor: float) -> torch.Tensor:
    """``x / divisor`` correctly rounded elementwise on every device.

    PyTorch on CUDA divides a tensor by a Python (or CPU) scalar by multiplying
    with the scalar's rounded reciprocal, which differs from true division in
    the last bit now and then; dividing by a tensor on ``x``'s device does not
    (a 0-dim one broadcasts, no copy of ``x``'s size).
    """
    return x / torch.tensor(divisor, dtype=x.dtype, device=x.device)


def round_down(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Largest ``dtype`` value ``<= x`` elementwise.

    Args:
        x: float32 tensor, any shape, finite.
        dtype: ``torch.float16`` or ``torch.bfloat16``.

    Returns:
        Tensor of ``dtype``, same shape; ``-inf`` where ``x`` is below the
        dtype's range.
    """
    rounded = x.to(dtype)
    bits = rounded.view(torch.int16).to(torch.int32)
    down = torch.where(bits == 0, torch.full_like(bits, _SMALLEST_NEGATIVE), bits - 1)
    down = torch.where(bits < 0, bits + 1, down)
    return torch.where(rounded.float() > x, _as_float(down, dtype), rounded)


def round_up(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Smallest ``dtype`` value ``>= x`` elementwise.

    Args:
        x: float32 tensor, any shape, finite.
        dtype: ``torch.float16`` or ``torch.bfloat16``.

    Returns:
        Tensor of ``dtype``, same shape; ``inf`` where ``x`` is above the
        dtype's range.
    """
    rounded = x.to(dtype)
    bits = rounded.view(torch.int16).to(torch.int32)
    up = torch.where(bits == _NEGATIVE_ZERO, torch.ones_like(bits), bits - 1)
    up = torch.where(bits >= 0, bits + 1, up)
    return torch.where(rounded.float() < x, _as_float(up, dtype), rounded)


def _as_float(bits: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return bits.to(torch.int16).view(dtype)
