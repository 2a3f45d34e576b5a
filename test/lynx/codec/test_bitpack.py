"""Dense LSB-first packing: exact layout and round trips."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lynx.codec.bitpack import pack_bits, unpack_bits


@settings(max_examples=60, deadline=None)
@given(width=st.integers(1, 16), count=st.integers(0, 70), seed=st.integers(0, 2**31 - 1))
def test_unpack_inverts_pack_for_every_width(width, count, seed):
    generator = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 1 << width, (count,), generator=generator, dtype=torch.int32)
    packed = pack_bits(codes, width)
    assert packed.dtype == torch.uint8
    assert packed.numel() == (count * width + 7) // 8
    assert torch.equal(unpack_bits(packed, width, count), codes)


@pytest.mark.parametrize("width", range(1, 17))
@pytest.mark.parametrize("count", [1, 7, 63, 65, 131])
def test_pack_matches_bitwise_definition(width, count):
    codes = torch.randint(0, 1 << width, (count,), generator=torch.Generator().manual_seed(width * count))
    bits = [(int(code) >> j) & 1 for code in codes for j in range(width)]
    bits += [0] * (-len(bits) % 8)
    expected = [sum(bits[8 * i + j] << j for j in range(8)) for i in range(len(bits) // 8)]
    assert pack_bits(codes, width).tolist() == expected


def test_four_bit_codes_put_first_code_in_low_nibble():
    assert pack_bits(torch.tensor([0x3, 0xA, 0x5], dtype=torch.uint8), 4).tolist() == [0xA3, 0x05]


def test_twelve_bit_codes_fill_three_bytes_per_pair():
    assert pack_bits(torch.tensor([0xABC, 0x123]), 12).tolist() == [0xBC, 0x3A, 0x12]


def test_int16_codes_are_read_as_unsigned_words():
    codes = torch.tensor([0xFFFF, 0x8001, 0x0002], dtype=torch.int32)
    packed = pack_bits(codes.to(torch.int16), 16)
    assert torch.equal(unpack_bits(packed, 16, 3), codes)


def test_unpack_ignores_trailing_bytes():
    codes = torch.tensor([1, 2, 3])
    packed = torch.cat([pack_bits(codes, 5), torch.full((4,), 255, dtype=torch.uint8)])
    assert torch.equal(unpack_bits(packed, 5, 3), codes.to(torch.int32))


@pytest.mark.parametrize("codes,width", [([4], 2), ([-1], 3), ([256], 8)])
def test_pack_rejects_codes_outside_width(codes, width):
    with pytest.raises(ValueError, match="codes must lie"):
        pack_bits(torch.tensor(codes), width)


@pytest.mark.parametrize("width", [0, 17, 2.0])
def test_pack_rejects_bad_width(width):
    with pytest.raises(ValueError, match="width"):
        pack_bits(torch.tensor([0]), width)


def test_pack_rejects_float_and_multi_dim_codes():
    with pytest.raises(ValueError, match="integer dtype"):
        pack_bits(torch.tensor([1.0]), 4)
    with pytest.raises(ValueError, match="1-D"):
        pack_bits(torch.zeros(2, 2, dtype=torch.int32), 4)


def test_unpack_rejects_short_buffer():
    with pytest.raises(ValueError, match="need 2 bytes"):
        unpack_bits(torch.zeros(1, dtype=torch.uint8), 3, 5)
