"""Encode one layer's K and V into prioritized byte streams and decode them.

The streams follow the wire layout described in :mod:`lynx.codec.layout`.
Scales, minima and raw tensors travel as their little-endian bytes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate

import torch

from lynx.codec.bitpack import pack_bits, unpack_bits
from lynx.codec.layout import anchor_sections, check_input_dtype, num_key_groups, packed_bytes
from lynx.codec.quant import dequantize_key, dequantize_value, quantize_key, quantize_value
from lynx.codec.spec import CodecSpec
from lynx.codec.stages import merge_stages, prefix_bits, split_stages


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
    key_codes, key_mn, key_scale = quantize_key(key, spec)
    value_codes, value_mn, value_scale = quantize_value(value, spec)
    key_stages = split_stages(key_codes.reshape(-1), spec.stage_bits)
    value_stages = split_stages(value_codes.reshape(-1), spec.stage_bits)
    anchor_bits = spec.anchor_bits
    anchor = torch.cat(
        [
            _to_bytes(key_mn),
            _to_bytes(key_scale),
            _to_bytes(value_mn),
            _to_bytes(value_scale),
            pack_bits(key_stages[0], anchor_bits),
            pack_bits(value_stages[0], anchor_bits),
        ]
    )
    streams = [anchor]
    for width, key_part, value_part in zip(spec.stage_bits[1:], key_stages[1:], value_stages[1:]):
        streams.append(torch.cat([pack_bits(key_part, width), pack_bits(value_part, width)]))
    if spec.raw_residual:
        streams.append(torch.cat([_to_bytes(key), _to_bytes(value)]))
    tokens, heads, head_dim = key.shape
    return EncodedKV(spec, tuple(streams), tokens, heads, head_dim, key.dtype)


def decode(encoded: EncodedKV, stages: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Rebuild K and V from the first ``stages`` streams.

    Args:
        encoded: the streams received so far.
        stages: how many streams to use, ``1..len(encoded.streams)``; default
            all present. Quantized stages give bucket-centre estimates; the
            raw residual stream, when used, gives the input bit for bit.

    Returns:
        ``(key, value)``, each ``[T, H, D]`` in the encoded dtype, on the
        streams' device.
    """
    available = len(encoded.streams)
    count = available if stages is None else stages
    if not isinstance(count, int) or isinstance(count, bool) or not 1 <= count <= available:
        raise ValueError(f"stages must be an int in 1..{available} (streams present), got {stages!r}")
    spec = encoded.spec
    shape = (encoded.num_tokens, encoded.kv_heads, encoded.head_dim)
    if spec.raw_residual and count == spec.num_stages:
        raw = encoded.streams[-1]
        half = raw.numel() // 2
        return _from_bytes(raw[:half], encoded.dtype, shape), _from_bytes(raw[half:], encoded.dtype, shape)
    quantized = min(count, spec.num_quantized_stages)
    key_mn, key_scale, value_mn, value_scale, key_stages, value_stages = _read_anchor(encoded)
    elements = shape[0] * shape[1] * shape[2]
    for width, stream in zip(spec.stage_bits[1:quantized], encoded.streams[1:quantized]):
        key_bytes = packed_bytes(elements, width)
        key_stages.append(unpack_bits(stream[:key_bytes], width, elements))
        value_stages.append(unpack_bits(stream[key_bytes:], width, elements))
    known = prefix_bits(spec.stage_bits, quantized)
    key_codes = merge_stages(key_stages, spec.stage_bits).reshape(shape)
    value_codes = merge_stages(value_stages, spec.stage_bits).reshape(shape)
    key = dequantize_key(key_codes, key_mn, key_scale, spec, known)
    value = dequantize_value(value_codes, value_mn, value_scale, spec, known)
    return key.to(encoded.dtype), value.to(encoded.dtype)


def _read_anchor(encoded: EncodedKV) -> tuple:
    """Split the anchor into key/value minima and scales and stage-0 codes."""
    spec = encoded.spec
    tokens, heads, head_dim = encoded.num_tokens, encoded.kv_heads, encoded.head_dim
    sizes = anchor_sections(spec, tokens, heads, head_dim)
    bounds = [0, *accumulate(sizes)]
    sections = [encoded.streams[0][start:end] for start, end in zip(bounds, bounds[1:])]
    key_shape = (num_key_groups(spec, tokens), heads, head_dim)
    value_shape = (tokens, heads, head_dim // spec.value_group_channels)
    scale_dtype = spec.torch_scale_dtype
    elements = tokens * heads * head_dim
    return (
        _from_bytes(sections[0], scale_dtype, key_shape),
        _from_bytes(sections[1], scale_dtype, key_shape),
        _from_bytes(sections[2], scale_dtype, value_shape),
        _from_bytes(sections[3], scale_dtype, value_shape),
        [unpack_bits(sections[4], spec.anchor_bits, elements)],
        [unpack_bits(sections[5], spec.anchor_bits, elements)],
    )


def _to_bytes(tensor: torch.Tensor) -> torch.Tensor:
    """Row-major bytes of ``tensor`` as a 1-D uint8 tensor."""
    return tensor.contiguous().view(torch.uint8).reshape(-1)


def _from_bytes(buf: torch.Tensor, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    """Reinterpret row-major bytes as a ``dtype`` tensor of ``shape``."""
    return buf.clone().view(dtype).reshape(shape)
