"""Directed rounding to 16-bit floats, checked against every representable value."""

import pytest
import torch

from lynx.codec.rounding import round_down, round_up


def _representable(dtype):
    """All finite values of ``dtype`` as sorted float32 (zeros merged)."""
    every = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(dtype).float()
    return torch.unique(every[torch.isfinite(every)])


def _samples(dtype):
    generator = torch.Generator().manual_seed(0)
    limit = torch.finfo(dtype).max
    return torch.cat(
        [
            torch.randn(3000, generator=generator) * 10,
            torch.randn(1000, generator=generator) * 1e-6,
            torch.tensor([0.0, -0.0, 1.0, -1.0, 0.1, -0.1, 1e-9, -1e-9, limit, -limit]),
        ]
    )


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_round_down_gives_largest_representable_not_above(dtype):
    grid, x = _representable(dtype), _samples(dtype)
    expected = grid[torch.searchsorted(grid, x, right=True) - 1]
    down = round_down(x, dtype)
    assert down.dtype == dtype
    assert torch.equal(down.float(), expected)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_round_up_gives_smallest_representable_not_below(dtype):
    grid, x = _representable(dtype), _samples(dtype)
    expected = grid[torch.searchsorted(grid, x, right=False)]
    up = round_up(x, dtype)
    assert up.dtype == dtype
    assert torch.equal(up.float(), expected)


def test_rounding_past_the_range_gives_infinity():
    x = torch.tensor([70000.0, -70000.0])
    assert round_up(x, torch.float16).tolist() == [float("inf"), -65504.0]
    assert round_down(x, torch.float16).tolist() == [65504.0, float("-inf")]
