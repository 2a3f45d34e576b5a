"""Hierarchical stages: the anchor code and the codes that refine it.

Everything here is in units of a group's anchor step ``s``: an element sits
at *position* ``t = (x - mn) / s`` in ``[0, L]``, ``L = 2^a - 1`` for an
``a``-bit anchor, and decodes to ``mn + s * level``. After each stage the
decoder knows a *cell*, an interval that holds ``t``, and its level:

* Anchor (``a`` bits): code ``c = clamp(floor(t + 1/2), 0, L)``, level ``c``,
  a rounded ``a``-bit quantization whose grid holds both ends of the group.
  Its cell is centred, ``[c - 1/2, c + 1/2]``, except at the group's ends,
  where it is one-sided: extent ``1/2`` above level 0 (``c = 0``) or below
  level ``L`` (``c = L``), since no element lies beyond the ends.
* A later stage of ``w`` bits, ``n = 2^w`` codes, splits the cell in ``n``:
  a centred cell of width ``W`` into centred cells of width ``h = W / n``,
  levels at their centres; a one-sided cell of extent ``W`` into levels
  ``j * h`` away from its level towards the group, ``h = 2W / (2n - 1)``,
  where cell ``j = 0`` (the group's end itself) is again one-sided, of extent
  ``h / 2``, and the others are centred, of width ``h``. The code is the index
  ``j`` of the cell that holds ``t``, clamped to ``[0, n)``.

So after any stage each element is within ``h / 2`` of its level, ``h`` the
step of its cell at that stage (the anchor's is 1); each level lies in the
previous stage's cell; the group's ends stay exact at every stage. For
``4+4``: ``h = 1/16`` inside the group, ``1/31`` in its two end cells.

Arithmetic is float32 in a fixed order with no fused multiply-add; the
Triton kernels (``lynx_kernels.stages``) repeat it op for op.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import NamedTuple

import torch

from lynx.codec.rounding import divide


class Cell(NamedTuple):
    """What the decoder knows of each element after some stages (float32 tensors of one shape).

    Attributes:
        level: the decoded position.
        width: the cell's width (centred cells) or extent (one-sided cells).
        side: 0 for a centred cell, +1 for a cell above its level (the
            group's low end), -1 for a cell below it (the high end).
    """

    level: torch.Tensor
    width: torch.Tensor
    side: torch.Tensor


def anchor_codes(position: torch.Tensor, anchor_bits: int) -> torch.Tensor:
    """Anchor codes of float32 positions (any shape): ``clamp(floor(t + 1/2), 0, 2^a - 1)``, int32."""
    top = (1 << anchor_bits) - 1
    return torch.floor(position + 0.5).clamp_(0, top).to(torch.int32)


def anchor_cell(codes: torch.Tensor, anchor_bits: int) -> Cell:
    """The cell each anchor code leaves (see the module docstring)."""
    top = (1 << anchor_bits) - 1
    level = codes.float()
    # +1 at code 0, -1 at code `top`, 0 between, and the widths 1 / 0.5 that go with them:
    # exact small-integer float arithmetic, several times cheaper on a CPU than comparisons
    # and selections of boolean tensors.
    side = (1.0 - level).clamp_(min=0.0).sub_((level - (top - 1)).clamp_(min=0.0))
    return Cell(level, side.abs().mul_(-0.5).add_(1.0), side)


def refine_codes(position: torch.Tensor, cell: Cell, bits: int) -> torch.Tensor:
    """Codes of a ``bits``-wide stage: the index of the sub-cell of ``cell`` holding ``position``, int32."""
    count, centred = 1 << bits, cell.side == 0
    step = _step(cell, count, centred)
    offset = position - cell.level
    offset = torch.where(centred, offset, cell.side * offset)
    bias = torch.where(centred, count / 2, 0.5)
    return torch.floor(offset / step + bias).clamp_(0, count - 1).to(torch.int32)


def refine(cell: Cell, codes: torch.Tensor, bits: int) -> Cell:
    """The cell a ``bits``-wide stage's ``codes`` (int tensor of the cell's shape) leave inside ``cell``."""
    centred = cell.side == 0
    step = _step(cell, 1 << bits, centred)
    first = codes == 0
    width = torch.where(~centred & first, step * 0.5, step)
    return Cell(_level(cell, codes, bits, step, centred), width, torch.where(first, cell.side, 0.0))


def stage_codes(position: torch.Tensor, stage_bits: Sequence[int]) -> list[torch.Tensor]:
    """Codes of every stage for float32 positions in ``[0, 2^stage_bits[0] - 1]``.

    Args:
        position: float32 tensor, any shape.
        stage_bits: stage widths, anchor first.

    Returns:
        One int32 tensor of ``position``'s shape per stage; stage ``s`` holds
        values in ``[0, 2^stage_bits[s])``.
    """
    _check_stage_bits(stage_bits)
    codes = [anchor_codes(position, stage_bits[0])]
    if len(stage_bits) == 1:
        return codes
    cell = anchor_cell(codes[0], stage_bits[0])
    for index, bits in enumerate(stage_bits[1:], 1):
        codes.append(refine_codes(position, cell, bits))
        if index + 1 < len(stage_bits):
            cell = refine(cell, codes[-1], bits)
    return codes


def stage_levels(codes: Sequence[torch.Tensor], stage_bits: Sequence[int]) -> torch.Tensor:
    """Decoded positions from the first ``n`` stages' codes.

    Args:
        codes: ``1 <= n <= len(stage_bits)`` integer tensors of one shape, as
            :func:`stage_codes` returns (a prefix of them).
        stage_bits: stage widths, anchor first.

    Returns:
        float32 levels of that shape; with the anchor alone, its codes.

    A level depends on its element's codes alone, so it is looked up in
    the table :func:`levels_of_cells` computes for every combination of
    codes (at most ``2^16``), which gives the same float32 values as
    computing it element by element.
    """
    _check_stage_bits(stage_bits)
    if not 1 <= len(codes) <= len(stage_bits):
        raise ValueError(f"need between 1 and {len(stage_bits)} stages, got {len(codes)}")
    if len(codes) == 1:
        return codes[0].float()
    widths = tuple(stage_bits[: len(codes)])
    index = codes[0].int()  # at most 16 bits in all
    for stage, bits in zip(codes[1:], widths[1:]):
        index = (index << bits) | stage.int()
    return torch.take(_level_table(widths, str(index.device)), index.long())  # several times faster than [] on a CPU


def levels_of_cells(codes: Sequence[torch.Tensor], stage_bits: Sequence[int]) -> torch.Tensor:
    """:func:`stage_levels` computed cell by cell, as the module docstring describes (the
    arithmetic the Triton kernels repeat op for op)."""
    cell = anchor_cell(codes[0], stage_bits[0])
    for stage, bits in zip(codes[1:-1], stage_bits[1:]):
        cell = refine(cell, stage, bits)
    if len(codes) == 1:
        return cell.level
    last, centred = stage_bits[len(codes) - 1], cell.side == 0
    return _level(cell, codes[-1], last, _step(cell, 1 << last, centred), centred)


def _combinations(widths: tuple[int, ...]) -> list[torch.Tensor]:
    """Per stage its code in each of the ``2^sum(widths)`` combinations, the anchor's in the high bits."""
    combos = torch.arange(1 << sum(widths), dtype=torch.int64)
    codes, shift = [], sum(widths)
    for bits in widths:
        shift -= bits
        codes.append((combos >> shift) & ((1 << bits) - 1))
    return codes


@functools.lru_cache(maxsize=32)
def _level_table(widths: tuple[int, ...], device: str) -> torch.Tensor:
    """float32 ``[2^sum(widths)]``: the level of every combination of codes, the anchor's in the high bits."""
    return levels_of_cells(_combinations(widths), widths).to(device)


def _level(cell: Cell, codes: torch.Tensor, bits: int, step: torch.Tensor, centred: torch.Tensor) -> torch.Tensor:
    """Level of the sub-cell ``codes`` pick in ``cell``, whose sub-cells are ``step`` apart
    (``centred``: where ``cell.side == 0``, computed once by the caller)."""
    index = codes.float()
    middle = (index - ((1 << bits) - 1) / 2) * step
    sided = cell.side * (index * step)
    return cell.level + torch.where(centred, middle, sided)


def _step(cell: Cell, count: int, centred: torch.Tensor) -> torch.Tensor:
    """The sub-cells' step when ``cell`` is split in ``count`` (``centred`` as in `_level`)."""
    middle = cell.width * (1.0 / count)
    sided = divide(cell.width + cell.width, 2 * count - 1)
    return torch.where(centred, middle, sided)


def _check_stage_bits(stage_bits: Sequence[int]) -> None:
    if not stage_bits or any(width < 1 for width in stage_bits) or sum(stage_bits) > 16:
        raise ValueError(f"stage_bits must be widths >= 1 summing to at most 16, got {tuple(stage_bits)}")
