"""Encode one layer's K and V into prioritized byte streams and decode them.

The streams follow the wire layout described in :mod:`lynx.codec.layout`:
the first ``sink_tokens`` tokens raw in the anchor, the others quantized in
hierarchical stages (:mod:`lynx.codec.quant`). Scales, minima and raw tensors
travel as their little-endian bytes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import accumulate

import torch

from lynx.codec.bitpack import pack_bits, unpack_bits
from lynx.codec.layout import (
    AnchorSections,
    anchor_sections,
    check_input_dtype,
    num_key_groups,
    packed_bytes,
    sink_count,
)
from lynx.codec.quant import (
    Quantized,
    check_values,
    dequantize_key,
    dequantize_value,
    quantize_key,
    quantize_value,
)
from lynx.codec.spec import CodecSpec


@dataclass(frozen=True, eq=False)
class EncodedKV:
    """The streams of one encoded (key, value) pair and the shape they decode to.

    ``streams`` may hold only the first ``n`` streams (``1 <= n <=
    spec.num_stages``), e.g. what a receiver has so far; each stream must
    have exactly the length ``spec.stream_bytes`` gives for it.

    Attributes:
        spec: codec configuration used to encode.
        streams: 1-D uint8 tensors, anchor first, exactly the wire bytes.
        num_tokens, kv_heads, head_dim: shape ``[num_tokens, kv_heads, head_dim]``
            of the key and of the value.
        dtype: dtype of the encoded tensors, which decoding returns.
    """

    spec: CodecSpec
    streams: tuple[torch.Tensor, ...]
    num_tokens: int
    kv_heads: int
    head_dim: int
    dtype: torch.dtype

    def __post_init__(self) -> None:
        if not isinstance(self.spec, CodecSpec):
            raise ValueError(f"spec must be a CodecSpec, got {type(self.spec).__name__}")
        streams = tuple(self.streams)
        object.__setattr__(self, "streams", streams)
        check_input_dtype(self.dtype)
        expected = self.spec.stream_bytes(self.num_tokens, self.kv_heads, self.head_dim, self.dtype)
        if not 1 <= len(streams) <= len(expected):
            raise ValueError(f"expected between 1 and {len(expected)} streams, got {len(streams)}")
        for index, (stream, length) in enumerate(zip(streams, expected)):
            if not isinstance(stream, torch.Tensor) or stream.dtype != torch.uint8 or stream.dim() != 1:
                raise ValueError(f"stream {index} must be a 1-D uint8 tensor")
            if stream.numel() != length:
                raise ValueError(f"stream {index} holds {stream.numel()} bytes, the layout needs {length}")
            if stream.device != streams[0].device:
                raise ValueError(f"stream {index} is on {stream.device}, the anchor on {streams[0].device}")

    @classmethod
    def from_streams(
        cls,
        streams: Sequence[torch.Tensor],
        spec: CodecSpec,
        num_tokens: int,
        kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
    ) -> EncodedKV:
        """Rebuild from received bytes; raises ValueError if a stream's length is wrong."""
        return cls(spec, tuple(streams), num_tokens, kv_heads, head_dim, dtype)

    @property
    def num_received_stages(self) -> int:
        """Number of streams present, counting from the anchor."""
        return len(self.streams)

    @property
    def nbytes(self) -> int:
        """Total bytes of the present streams."""
        return sum(stream.numel() for stream in self.streams)


def encode(key: torch.Tensor, value: torch.Tensor, spec: CodecSpec) -> EncodedKV:
    """Quantize, split and pack one layer's K and V.

    Args:
        key, value: ``[T, H, D]`` of one dtype (float16, bfloat16 or float32),
            finite, any strides; ``D`` a multiple of ``value_group_channels``.
        spec: codec configuration.

    Returns:
        EncodedKV with all ``spec.num_stages`` streams, on the inputs' device.
    """
    if not isinstance(key, torch.Tensor) or not isinstance(value, torch.Tensor):
        raise ValueError("key and value must be tensors")
    if key.shape != value.shape or key.dtype != value.dtype or key.device != value.device:
        raise ValueError(
            f"key and value must share shape, dtype and device; got {tuple(key.shape)} {key.dtype} "
            f"{key.device} and {tuple(value.shape)} {value.dtype} {value.device}"
        )
    if key.dim() != 3:
        raise ValueError("key and value must be [tokens, kv_heads, head_dim] tensors")
    tokens, heads, head_dim = key.shape
    sinks = sink_count(spec, tokens)
    key_q = _quantize(quantize_key, key, sinks, spec, "key")
    value_q = _quantize(quantize_value, value, sinks, spec, "value")
    anchor = [as_bytes(key[:sinks]), as_bytes(value[:sinks])]
    streams = [[] for _ in spec.stage_bits]
    if key_q is not None and value_q is not None:
        anchor += [as_bytes(key_q.mn), as_bytes(key_q.scale), as_bytes(value_q.mn), as_bytes(value_q.scale)]
        for parts, width, key_codes, value_codes in zip(streams, spec.stage_bits, key_q.codes, value_q.codes):
            parts += [pack_bits(key_codes.reshape(-1), width), pack_bits(value_codes.reshape(-1), width)]
    streams[0] = anchor + streams[0]
    if spec.raw_residual:
        streams.append([as_bytes(key[sinks:]), as_bytes(value[sinks:])])
    empty = key.new_empty(0, dtype=torch.uint8)
    return EncodedKV(spec, tuple(torch.cat([empty, *parts]) for parts in streams), tokens, heads, head_dim, key.dtype)


def decode(encoded: EncodedKV, stages: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Rebuild K and V from the first ``stages`` streams.

    Args:
        encoded: the streams received so far.
        stages: how many streams to use, ``1..len(encoded.streams)``; default
            all present. The sink tokens are exact from the anchor on; the
            quantized tokens decode to the level their stages give; the raw
            residual stream, when used, gives them bit for bit.

    Returns:
        ``(key, value)``, each ``[T, H, D]`` in the encoded dtype, on the
        streams' device.
    """
    available = len(encoded.streams)
    count = available if stages is None else stages
    if not isinstance(count, int) or isinstance(count, bool) or not 1 <= count <= available:
        raise ValueError(f"stages must be an int in 1..{available} (streams present), got {stages!r}")
    spec, dtype = encoded.spec, encoded.dtype
    tokens, heads, head_dim = encoded.num_tokens, encoded.kv_heads, encoded.head_dim
    sinks = sink_count(spec, tokens)
    sections = _anchor_sections(encoded)
    key = [_from_bytes(sections.sink_keys, dtype, (sinks, heads, head_dim))]
    value = [_from_bytes(sections.sink_values, dtype, (sinks, heads, head_dim))]
    shape = (tokens - sinks, heads, head_dim)
    if sinks < tokens and spec.raw_residual and count == spec.num_stages:
        raw = encoded.streams[-1]
        key.append(_from_bytes(raw[: raw.numel() // 2], dtype, shape))
        value.append(_from_bytes(raw[raw.numel() // 2 :], dtype, shape))
    elif sinks < tokens:
        quantized_key, quantized_value = _dequantize(encoded, sections, min(count, spec.num_quantized_stages), shape)
        key.append(quantized_key.to(dtype))
        value.append(quantized_value.to(dtype))
    return torch.cat(key), torch.cat(value)


def _dequantize(
    encoded: EncodedKV, sections: AnchorSections, stages: int, shape: tuple[int, int, int]
) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 ``[Q, H, D]`` quantized keys and values from the first ``stages`` quantized stages."""
    spec = encoded.spec
    tokens, heads, head_dim = shape
    elements = tokens * heads * head_dim
    key_codes = [unpack_bits(sections.key_codes, spec.anchor_bits, elements).reshape(shape)]
    value_codes = [unpack_bits(sections.value_codes, spec.anchor_bits, elements).reshape(shape)]
    for width, stream in zip(spec.stage_bits[1:stages], encoded.streams[1:stages]):
        key_bytes = packed_bytes(elements, width)
        key_codes.append(unpack_bits(stream[:key_bytes], width, elements).reshape(shape))
        value_codes.append(unpack_bits(stream[key_bytes:], width, elements).reshape(shape))
    scale_dtype = spec.torch_scale_dtype
    key_params = (num_key_groups(spec, tokens), heads, head_dim)
    value_params = (tokens, heads, head_dim // spec.value_group_channels)
    key_mn = _from_bytes(sections.key_minima, scale_dtype, key_params)
    key_scale = _from_bytes(sections.key_scales, scale_dtype, key_params)
    value_mn = _from_bytes(sections.value_minima, scale_dtype, value_params)
    value_scale = _from_bytes(sections.value_scales, scale_dtype, value_params)
    return (dequantize_key(key_codes, key_mn, key_scale, spec),
            dequantize_value(value_codes, value_mn, value_scale, spec))


def _quantize(quantize: Callable, x: torch.Tensor, sinks: int, spec: CodecSpec, name: str) -> Quantized | None:
    """Check the sink tokens of ``x``, then quantize the others (None if there are none)."""
    if sinks:
        check_values(x[:sinks], spec, name)
    return quantize(x[sinks:], spec) if sinks < x.shape[0] else None


def _anchor_sections(encoded: EncodedKV) -> AnchorSections:
    """The anchor cut into its sections (uint8 views)."""
    sizes = anchor_sections(encoded.spec, encoded.num_tokens, encoded.kv_heads, encoded.head_dim, encoded.dtype)
    bounds = [0, *accumulate(sizes)]
    return AnchorSections(*(encoded.streams[0][start:end] for start, end in zip(bounds, bounds[1:])))


def as_bytes(tensor: torch.Tensor) -> torch.Tensor:
    """Row-major bytes of ``tensor`` as a 1-D uint8 tensor."""
    return tensor.contiguous().view(torch.uint8).reshape(-1)


def _from_bytes(buf: torch.Tensor, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    """Reinterpret row-major bytes as a ``dtype`` tensor of ``shape``."""
    return buf.clone().view(dtype).reshape(shape)
