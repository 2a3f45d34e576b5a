"""Directed rounding to 16-bit floats, checked against every representable value."""

import pytest
import torch

from lynx.codec.rounding import divide, round_down, round_up


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


def test_divide_is_correctly_rounded():
    """Against float64 division rounded once to float32 (exact for a quotient of two float32s),
    for the divisors the codec uses: anchor levels ``2^a - 1`` and stage cells ``2n - 1``."""
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(200_000, generator=generator) * torch.exp2(torch.randint(-20, 20, (200_000,), generator=generator))
    for divisor in (1, 3, 7, 15, 31, 63, 127, 255, 511, 1023, 4095, 65535, 5, 9, 17, 33):
        expected = (x.double() / divisor).float()
        assert torch.equal(divide(x, divisor), expected), divisor
