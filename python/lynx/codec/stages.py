"""Split quantized codes into bit-significance stages and merge them back.

With stage widths ``(w0, ..., w_{S-1})`` summing to ``b``, stage ``s`` holds
bits ``[low_s, low_s + w_s)`` of each code, where ``low_s`` is the sum of the
widths after ``s``; stage 0 (the anchor) is the top ``w0`` bits.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def split_stages(codes: torch.Tensor, stage_bits: Sequence[int]) -> list[torch.Tensor]:
    """Split ``b``-bit codes into one tensor per stage.

    Args:
        codes: integer tensor of any shape, values in ``[0, 2^b)`` where
            ``b = sum(stage_bits)``.
        stage_bits: stage widths, most significant first.

    Returns:
        ``len(stage_bits)`` int32 tensors of the shape of ``codes``; entry
        ``s`` has values in ``[0, 2^stage_bits[s])``.
    """
    _check_stage_bits(stage_bits)
    values = codes.to(torch.int32)
    stages = []
    low = sum(stage_bits)
    for width in stage_bits:
        low -= width
        stages.append((values >> low) & ((1 << width) - 1))
    return stages


def merge_stages(stage_codes: Sequence[torch.Tensor], stage_bits: Sequence[int]) -> torch.Tensor:
    """Reassemble the known prefix of each code from its first stages.

    Args:
        stage_codes: the first ``n`` stages (``1 <= n <= len(stage_bits)``),
            integer tensors of one shape, as returned by :func:`split_stages`.
        stage_bits: stage widths, most significant first.

    Returns:
        int32 tensor of that shape holding the top ``p`` bits of each code,
        ``p = sum(stage_bits[:n])``; with every stage it equals the codes
        given to :func:`split_stages` bit for bit.
    """
    _check_stage_bits(stage_bits)
    if not 1 <= len(stage_codes) <= len(stage_bits):
        raise ValueError(f"need between 1 and {len(stage_bits)} stages, got {len(stage_codes)}")
    merged = torch.zeros_like(stage_codes[0], dtype=torch.int32)
    for codes, width in zip(stage_codes, stage_bits):
        merged = (merged << width) | codes.to(torch.int32)
    return merged


def prefix_bits(stage_bits: Sequence[int], num_stages: int) -> int:
    """Bits of each code known after receiving the first ``num_stages`` stages."""
    return sum(stage_bits[:num_stages])


def _check_stage_bits(stage_bits: Sequence[int]) -> None:
    if not stage_bits or any(width < 1 for width in stage_bits) or sum(stage_bits) > 16:
        raise ValueError(f"stage_bits must be widths >= 1 summing to at most 16, got {tuple(stage_bits)}")
