"""Byte accounting of the wire layout: section and stream sizes, no tensors.

Format version 2. Of a request's ``T`` tokens the first ``S = min(sink_tokens,
T)`` are *sink tokens*, sent raw; the other ``Q = T - S`` are quantized.
Stream 0 (anchor) is, in order: the sink tokens' keys, then their values
(each ``[S, kv_heads, head_dim]`` in the input dtype), key minima, key scales
(each ``[num_key_groups, kv_heads, head_dim]``), value minima, value scales
(each ``[Q, kv_heads, head_dim // value_group_channels]``), all in the spec's
scale dtype, then the packed stage-0 codes of the quantized keys and of the
quantized values. Stream ``s`` in ``1..len(stage_bits)-1`` is the packed
stage-``s`` codes of the quantized keys then values. With ``raw_residual`` a
last stream holds the raw bytes of the quantized keys then values, contiguous,
in the input dtype. All multi-byte numbers are little-endian; a stream may be
empty (every token a sink token).

Version 1 (no version number on the wire) had no sink tokens and split one
``total_bits``-bit code into bit planes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple, Protocol, runtime_checkable

import torch

FORMAT_VERSION = 2
INPUT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
SCALE_BYTES = 2


@runtime_checkable
class SpecFields(Protocol):
    """The fields of a `lynx.codec.spec.CodecSpec` the byte accounting reads.

    A leaf: this module sizes the wire layout for `CodecSpec`, whose
    `stream_bytes` and `bytes_per_token` call back into it, so it names the
    fields it needs instead of importing the class.
    """

    @property
    def stage_bits(self) -> Sequence[int]: ...
    @property
    def anchor_bits(self) -> int: ...
    @property
    def key_group_tokens(self) -> int: ...
    @property
    def value_group_channels(self) -> int: ...
    @property
    def sink_tokens(self) -> int: ...
    @property
    def raw_residual(self) -> bool: ...


class AnchorSections(NamedTuple):
    """Byte size of each anchor section, in wire order."""

    sink_keys: int
    sink_values: int
    key_minima: int
    key_scales: int
    value_minima: int
    value_scales: int
    key_codes: int
    value_codes: int


def packed_bytes(count: int, width: int) -> int:
    """Bytes holding ``count`` codes of ``width`` bits packed densely."""
    return (count * width + 7) // 8


def sink_count(spec: SpecFields, num_tokens: int) -> int:
    """Number of leading tokens sent raw: ``min(sink_tokens, num_tokens)``."""
    return min(spec.sink_tokens, num_tokens)


def num_key_groups(spec: SpecFields, num_tokens: int) -> int:
    """Number of token blocks sharing a key min/scale among ``num_tokens`` quantized tokens."""
    return -(-num_tokens // spec.key_group_tokens)


def check_shape(spec: SpecFields, num_tokens: int, kv_heads: int, head_dim: int) -> None:
    """Raise ValueError unless ``[num_tokens, kv_heads, head_dim]`` can be encoded."""
    for name, size in (("num_tokens", num_tokens), ("kv_heads", kv_heads), ("head_dim", head_dim)):
        if not isinstance(size, int) or isinstance(size, bool) or size < 1:
            raise ValueError(f"{name} must be a positive int, got {size!r}")
    if head_dim % spec.value_group_channels != 0:
        raise ValueError(
            f"head_dim {head_dim} is not a multiple of value_group_channels "
            f"{spec.value_group_channels}"
        )


def check_input_dtype(dtype: torch.dtype) -> None:
    """Raise ValueError unless ``dtype`` is a supported input dtype."""
    if dtype not in INPUT_DTYPES:
        raise ValueError(f"input dtype must be one of {INPUT_DTYPES}, got {dtype}")


def anchor_sections(
    spec: SpecFields, num_tokens: int, kv_heads: int, head_dim: int, dtype: torch.dtype
) -> AnchorSections:
    """Byte sizes of the anchor's sections for ``num_tokens`` tokens of input ``dtype``."""
    check_shape(spec, num_tokens, kv_heads, head_dim)
    check_input_dtype(dtype)
    sinks = sink_count(spec, num_tokens)
    quantized = num_tokens - sinks
    sink_bytes = sinks * kv_heads * head_dim * dtype.itemsize
    key_params = num_key_groups(spec, quantized) * kv_heads * head_dim * SCALE_BYTES
    value_params = quantized * kv_heads * (head_dim // spec.value_group_channels) * SCALE_BYTES
    codes = packed_bytes(quantized * kv_heads * head_dim, spec.anchor_bits)
    return AnchorSections(sink_bytes, sink_bytes, key_params, key_params, value_params, value_params, codes, codes)


def stream_bytes(
    spec: SpecFields, num_tokens: int, kv_heads: int, head_dim: int, dtype: torch.dtype
) -> tuple[int, ...]:
    """Exact byte length of each stream, anchor first; see :meth:`CodecSpec.stream_bytes`."""
    sizes = [sum(anchor_sections(spec, num_tokens, kv_heads, head_dim, dtype))]
    elements = (num_tokens - sink_count(spec, num_tokens)) * kv_heads * head_dim
    sizes += [2 * packed_bytes(elements, width) for width in spec.stage_bits[1:]]
    if spec.raw_residual:
        sizes.append(2 * elements * dtype.itemsize)
    return tuple(sizes)


def bytes_per_token(spec: SpecFields, kv_heads: int, head_dim: int, dtype: torch.dtype) -> tuple[float, ...]:
    """Bytes per quantized token of each stream; see :meth:`CodecSpec.bytes_per_token`."""
    check_input_dtype(dtype)
    check_shape(spec, 1, kv_heads, head_dim)
    channels = kv_heads * head_dim
    key_params = 2 * channels * SCALE_BYTES / spec.key_group_tokens
    value_params = 2 * kv_heads * (head_dim // spec.value_group_channels) * SCALE_BYTES
    per_token = [key_params + value_params + 2 * channels * spec.anchor_bits / 8]
    per_token += [2 * channels * width / 8 for width in spec.stage_bits[1:]]
    if spec.raw_residual:
        per_token.append(float(2 * channels * dtype.itemsize))
    return tuple(per_token)
