"""Host-side launch planning: which specs the kernels handle, tile shapes, stage widths.

A key program covers one block of ``key_group_tokens`` tokens of one head
over a chunk of channels (key groups are per channel, so channels split
freely); a value program covers a few tokens of one head over all channels
(value groups span channels).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from lynx.codec.layout import anchor_sections, packed_bytes, sink_count
from lynx.codec.spec import CodecSpec

MAX_STAGES = 4
TILE_ELEMENTS = 4096
NUM_WARPS = 4
MIN_CHANNELS = 8
MAX_KEY_GROUP_TOKENS = 1024
MAX_VALUE_CHANNELS = 4096

_TRITON_DTYPES = {torch.float16: tl.float16, torch.bfloat16: tl.bfloat16, torch.float32: tl.float32}


def supports(spec: CodecSpec, head_dim: int) -> bool:
    """Whether the kernels encode/decode ``spec`` for heads of ``head_dim``.

    Every stage width 1..16 is handled, in up to ``MAX_STAGES`` quantized
    stages, when each head row of codes ends on a byte boundary
    (``head_dim * width % 8 == 0``), ``value_group_channels`` is a power of
    two dividing ``head_dim`` and ``key_group_tokens <= MAX_KEY_GROUP_TOKENS``.
    Anything else is left to the reference.
    """
    if not isinstance(spec, CodecSpec) or not isinstance(head_dim, int) or head_dim < 1:
        return False
    group = spec.value_group_channels
    return (
        spec.num_quantized_stages <= MAX_STAGES
        and group & (group - 1) == 0
        and head_dim % group == 0
        and all(head_dim * width % 8 == 0 for width in spec.stage_bits)
        and spec.key_group_tokens <= MAX_KEY_GROUP_TOKENS
        and _value_channels(spec, head_dim) <= MAX_VALUE_CHANNELS
    )


@dataclass(frozen=True)
class TilePlan:
    """Tile shape of the key and value programs (all powers of two).

    Attributes:
        key_tokens: tokens per key tile, ``key_group_tokens`` rounded up.
        key_channels: channels per key tile, at least ``MIN_CHANNELS`` so a
            chunk starts byte-aligned for every width.
        value_tokens: tokens per value tile.
        value_channels: channels per value tile, ``head_dim`` padded to a
            power-of-two number of value groups.
        warps: warps per program.
    """

    key_tokens: int
    key_channels: int
    value_tokens: int
    value_channels: int
    warps: int = NUM_WARPS

    @classmethod
    def for_shape(
        cls, spec: CodecSpec, head_dim: int, tile_elements: int = TILE_ELEMENTS, warps: int = NUM_WARPS
    ) -> TilePlan:
        """Plan for a spec and head_dim that :func:`supports` accepts, tiles of about
        ``tile_elements`` elements (a power of two) run by ``warps`` warps."""
        key_tokens = triton.next_power_of_2(spec.key_group_tokens)
        key_channels = max(MIN_CHANNELS, min(triton.next_power_of_2(head_dim), tile_elements // key_tokens))
        value_channels = _value_channels(spec, head_dim)
        return cls(key_tokens, key_channels, max(1, tile_elements // value_channels), value_channels, warps)


def stage_widths(spec: CodecSpec, quantized_stages: int) -> tuple[int, int, int, int]:
    """Widths of the first ``quantized_stages`` stages, zero-padded to ``MAX_STAGES``."""
    widths = spec.stage_bits[:quantized_stages]
    return (*widths, *(0,) * (MAX_STAGES - len(widths)))


@dataclass(frozen=True)
class WireOffsets:
    """Byte offsets of one layer's sections in the wire layout of :mod:`lynx.codec.layout`.

    Attributes:
        sink_keys, sink_values: offsets of the sink tokens' raw bytes in the anchor.
        key_min, key_scale, value_min, value_scale: offsets in the anchor.
        key_codes, value_codes: offset of the packed key/value codes of each
            quantized stage in that stage's stream, zero-padded to ``MAX_STAGES``.
    """

    sink_keys: int
    sink_values: int
    key_min: int
    key_scale: int
    value_min: int
    value_scale: int
    key_codes: tuple[int, int, int, int]
    value_codes: tuple[int, int, int, int]

    @classmethod
    def for_shape(
        cls, spec: CodecSpec, num_tokens: int, kv_heads: int, head_dim: int, dtype: torch.dtype
    ) -> WireOffsets:
        """Offsets for ``num_tokens`` tokens of ``[kv_heads, head_dim]`` in input ``dtype``."""
        sizes = anchor_sections(spec, num_tokens, kv_heads, head_dim, dtype)
        starts = [sum(sizes[:index]) for index in range(len(sizes))]
        elements = (num_tokens - sink_count(spec, num_tokens)) * kv_heads * head_dim
        key_codes = (starts[6], *(0,) * (MAX_STAGES - 1))
        value_codes = (starts[7], *(packed_bytes(elements, width) for width in spec.stage_bits[1:]))
        value_codes += (0,) * (MAX_STAGES - len(value_codes))
        return cls(*starts[:6], key_codes, value_codes)


def triton_dtype(dtype: torch.dtype) -> tl.dtype:
    """Triton element type of a float16/bfloat16/float32 torch dtype."""
    return _TRITON_DTYPES[dtype]


def _value_channels(spec: CodecSpec, head_dim: int) -> int:
    groups = max(1, head_dim // spec.value_group_channels)
    return triton.next_power_of_2(groups) * spec.value_group_channels
