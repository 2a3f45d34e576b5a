"""Byte accounting of the wire layout: section and stream sizes, no tensors.

Stream 0 (anchor) is, in order: key minima, key scales (each
``[num_key_groups, kv_heads, head_dim]``), value minima, value scales (each
``[tokens, kv_heads, head_dim // value_group_channels]``), all in the spec's
scale dtype, then the packed stage-0 codes of the key and of the value.
Stream ``s`` in ``1..len(stage_bits)-1`` is the packed stage-``s`` codes of
the key then of the value. With ``raw_residual`` a last stream holds the raw
bytes of the key then of the value, contiguous, in the input dtype.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from lynx.codec.spec import CodecSpec

INPUT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
SCALE_BYTES = 2


def packed_bytes(count: int, width: int) -> int:
    """Bytes holding ``count`` codes of ``width`` bits packed densely."""
    return (count * width + 7) // 8


def num_key_groups(spec: CodecSpec, num_tokens: int) -> int:
    """Number of token blocks sharing a key min/scale."""
    return -(-num_tokens // spec.key_group_tokens)


def check_shape(spec: CodecSpec, num_tokens: int, kv_heads: int, head_dim: int) -> None:
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


def anchor_sections(spec: CodecSpec, num_tokens: int, kv_heads: int, head_dim: int) -> tuple[int, ...]:
    """Byte sizes of the six anchor sections, in wire order: key minima, key
    scales, value minima, value scales, key stage-0 codes, value stage-0 codes.
    """
    check_shape(spec, num_tokens, kv_heads, head_dim)
    key_params = num_key_groups(spec, num_tokens) * kv_heads * head_dim * SCALE_BYTES
    value_params = num_tokens * kv_heads * (head_dim // spec.value_group_channels) * SCALE_BYTES
    codes = packed_bytes(num_tokens * kv_heads * head_dim, spec.anchor_bits)
    return (key_params, key_params, value_params, value_params, codes, codes)


def stream_bytes(
    spec: CodecSpec, num_tokens: int, kv_heads: int, head_dim: int, dtype: torch.dtype
) -> tuple[int, ...]:
    """Exact byte length of each stream, anchor first; see :meth:`CodecSpec.stream_bytes`."""
    check_input_dtype(dtype)
    sizes = [sum(anchor_sections(spec, num_tokens, kv_heads, head_dim))]
    elements = num_tokens * kv_heads * head_dim
    sizes += [2 * packed_bytes(elements, width) for width in spec.stage_bits[1:]]
    if spec.raw_residual:
        sizes.append(2 * elements * dtype.itemsize)
    return tuple(sizes)


def bytes_per_token(spec: CodecSpec, kv_heads: int, head_dim: int, dtype: torch.dtype) -> tuple[float, ...]:
    """Bytes per token of each stream; see :meth:`CodecSpec.bytes_per_token`."""
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
