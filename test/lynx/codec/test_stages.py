"""Stage split/merge: exact bit-plane round trips."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lynx.codec.stages import merge_stages, prefix_bits, split_stages

stage_bits_strategy = st.lists(st.integers(1, 16), min_size=1, max_size=6).filter(lambda bits: sum(bits) <= 16)


@settings(max_examples=80, deadline=None)
@given(stage_bits=stage_bits_strategy, seed=st.integers(0, 2**31 - 1))
def test_merge_of_split_is_bit_exact(stage_bits, seed):
    total = sum(stage_bits)
    codes = torch.randint(0, 1 << total, (5, 3, 8), generator=torch.Generator().manual_seed(seed), dtype=torch.int32)
    stages = split_stages(codes, stage_bits)
    assert len(stages) == len(stage_bits)
    for stage, width in zip(stages, stage_bits):
        assert stage.dtype == torch.int32
        assert int(stage.min()) >= 0 and int(stage.max()) < 1 << width
    assert torch.equal(merge_stages(stages, stage_bits), codes)


@settings(max_examples=50, deadline=None)
@given(stage_bits=stage_bits_strategy, seed=st.integers(0, 2**31 - 1), data=st.data())
def test_merge_of_prefix_gives_top_bits(stage_bits, seed, data):
    total = sum(stage_bits)
    count = data.draw(st.integers(1, len(stage_bits)))
    codes = torch.randint(0, 1 << total, (40,), generator=torch.Generator().manual_seed(seed), dtype=torch.int32)
    prefix = merge_stages(split_stages(codes, stage_bits)[:count], stage_bits)
    assert torch.equal(prefix, codes >> (total - prefix_bits(stage_bits, count)))


def test_anchor_is_top_bits_and_residual_low_bits():
    codes = torch.tensor([0xA7, 0x0F, 0xF0])
    anchor, residual = split_stages(codes, (4, 4))
    assert anchor.tolist() == [0xA, 0x0, 0xF]
    assert residual.tolist() == [0x7, 0xF, 0x0]


def test_three_stages_take_bits_most_significant_first():
    stages = split_stages(torch.tensor([0b10_01_1100]), (2, 2, 4))
    assert [stage.item() for stage in stages] == [0b10, 0b01, 0b1100]


@pytest.mark.parametrize("count", [0, 3])
def test_merge_rejects_stage_count_out_of_range(count):
    stages = [torch.zeros(2, dtype=torch.int32)] * count
    with pytest.raises(ValueError, match="stages"):
        merge_stages(stages, (4, 4))


@pytest.mark.parametrize("stage_bits", [(), (0, 4), (9, 8)])
def test_split_rejects_invalid_stage_bits(stage_bits):
    with pytest.raises(ValueError, match="stage_bits"):
        split_stages(torch.zeros(2, dtype=torch.int32), stage_bits)
