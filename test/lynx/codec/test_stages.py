"""Hierarchical stages: a rounded anchor, nested cells, exact group ends, error within half a step."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lynx.codec.stages import (
    anchor_cell,
    anchor_codes,
    levels_of_cells,
    refine,
    refine_codes,
    stage_codes,
    stage_levels,
)

stage_bits_strategy = st.lists(st.integers(1, 8), min_size=1, max_size=4).filter(lambda bits: sum(bits) <= 16)


def _positions(anchor_bits, seed, count=4000):
    """Positions over ``[0, L]``: random, both ends, and every half-way point between anchor levels."""
    top = (1 << anchor_bits) - 1
    generator = torch.Generator().manual_seed(seed)
    halves = torch.arange(0, 2 * top + 1, dtype=torch.float32) / 2
    return torch.cat([torch.rand(count, generator=generator) * top, halves])


def _cell_holds(cell, position):
    """Elementwise: ``position`` lies in ``cell`` (float32 slack of a few ulps)."""
    slack = 4e-6 * (1 + position.abs())
    below = torch.where(cell.side == 0, cell.width / 2, torch.where(cell.side > 0, 0.0, cell.width))
    above = torch.where(cell.side == 0, cell.width / 2, torch.where(cell.side > 0, cell.width, 0.0))
    low, high = cell.level - below, cell.level + above
    return (position >= low - slack) & (position <= high + slack)


def test_anchor_is_rounding_to_the_nearest_level_with_both_ends_reachable():
    position = torch.tensor([0.0, 0.49, 0.5, 1.2, 14.5, 14.6, 15.0, 15.3])
    assert anchor_codes(position, 4).tolist() == [0, 0, 1, 1, 15, 15, 15, 15]
    assert stage_levels([anchor_codes(position, 4)], (4,)).tolist() == [0, 0, 1, 1, 15, 15, 15, 15]


@settings(max_examples=40, deadline=None)
@given(stage_bits=stage_bits_strategy, seed=st.integers(0, 2**31 - 1))
def test_each_stage_lands_in_its_cell_nested_in_the_previous_one(stage_bits, seed):
    position = _positions(stage_bits[0], seed)
    codes = stage_codes(position, stage_bits)
    assert [int(c.max()) < 1 << w and int(c.min()) >= 0 for c, w in zip(codes, stage_bits)] == [True] * len(codes)
    cell = anchor_cell(codes[0], stage_bits[0])
    assert bool(_cell_holds(cell, position).all())
    for stage, bits in zip(codes[1:], stage_bits[1:]):
        finer = refine(cell, stage, bits)
        assert bool(_cell_holds(finer, position).all())
        assert bool(_cell_holds(cell, finer.level).all())
        assert bool((finer.width <= cell.width).all())
        cell = finer


@settings(max_examples=40, deadline=None)
@given(stage_bits=stage_bits_strategy, seed=st.integers(0, 2**31 - 1))
def test_every_prefix_decodes_within_half_its_step_and_the_full_one_within_half_the_finest(stage_bits, seed):
    position = _positions(stage_bits[0], seed)
    codes = stage_codes(position, stage_bits)
    for count in range(1, len(stage_bits) + 1):
        error = (stage_levels(codes[:count], stage_bits) - position).abs()
        finest = 2.0 ** -sum(stage_bits[1:count])
        assert bool((error <= finest / 2 + 4e-6 * (1 + position)).all())


@settings(max_examples=30, deadline=None)
@given(stage_bits=stage_bits_strategy)
def test_group_ends_stay_exact_at_every_stage(stage_bits):
    top = float((1 << stage_bits[0]) - 1)
    ends = torch.tensor([0.0, top])
    codes = stage_codes(ends, stage_bits)
    for count in range(1, len(stage_bits) + 1):
        assert stage_levels(codes[:count], stage_bits).tolist() == [0.0, top]


def test_four_plus_four_steps_are_a_sixteenth_inside_and_a_thirty_first_at_the_ends():
    anchor = torch.tensor([5] * 16 + [0] * 16 + [15] * 16)
    residual = torch.arange(16).repeat(3)
    levels = stage_levels([anchor, residual], (4, 4))
    index = torch.arange(16, dtype=torch.float32)
    expected = torch.cat([5 + (index - 7.5) / 16, index * (1 / 31), 15 - index * (1 / 31)])
    assert torch.equal(levels, expected)


def test_residual_is_the_index_of_the_sub_cell_holding_the_position():
    cell = anchor_cell(torch.tensor([5, 0, 15]), 4)
    position = torch.tensor([5.0 - 0.5 + 3.5 / 16, 2.2 / 31, 15 - 9.4 / 31])
    assert refine_codes(position, cell, 4).tolist() == [3, 2, 9]


def test_codes_of_positions_past_the_group_ends_are_clamped():
    codes = stage_codes(torch.tensor([-0.3, 15.4]), (4, 4))
    assert [c.tolist() for c in codes] == [[0, 15], [0, 0]]


@settings(max_examples=30, deadline=None)
@given(stage_bits=stage_bits_strategy, seed=st.integers(0, 2**16))
def test_looked_up_levels_are_bit_for_bit_the_levels_computed_cell_by_cell(stage_bits, seed):
    codes = stage_codes(_positions(stage_bits[0], seed), stage_bits)
    for count in range(1, len(stage_bits) + 1):
        looked_up, computed = stage_levels(codes[:count], stage_bits), levels_of_cells(codes[:count], stage_bits)
        assert torch.equal(looked_up.view(torch.int32), computed.view(torch.int32))


@pytest.mark.parametrize("count", [0, 3])
def test_levels_reject_stage_count_out_of_range(count):
    with pytest.raises(ValueError, match="stages"):
        stage_levels([torch.zeros(2, dtype=torch.int32)] * count, (4, 4))


@pytest.mark.parametrize("stage_bits", [(), (0, 4), (9, 8)])
def test_codes_reject_invalid_stage_bits(stage_bits):
    with pytest.raises(ValueError, match="stage_bits"):
        stage_codes(torch.zeros(2), stage_bits)
