"""Asymmetric min/scale quantization with KIVI grouping, in hierarchical stages.

Keys share a minimum and scale per (kv_head, channel) over blocks of
``key_group_tokens`` tokens; values per (token, kv_head) over groups of
``value_group_channels`` channels. For a group with an ``a``-bit anchor
(``a = stage_bits[0]``, ``L = 2^a - 1``), computed in float32:

* ``mn = round_down(min)`` and ``scale = round_up((max - mn) / L)`` in the
  scale dtype, so the receiver's anchor grid ``mn + scale * [0, L]`` covers
  the group: the anchor step, whatever stages follow;
* position ``t = (x - mn) / scale`` with the rounded ``mn`` and ``scale``
  (``t = 0`` where ``scale == 0``), and the codes of every stage from ``t``
  as :mod:`lynx.codec.stages` describes;
* decoding the first ``n`` stages gives ``mn + scale * level``.

So the anchor alone decodes exactly as a plain ``a``-bit quantization
(``stage_bits=(a,)``) of the same group does.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

import torch

from lynx.codec.layout import INPUT_DTYPES, check_shape, num_key_groups
from lynx.codec.rounding import divide, round_down, round_up
from lynx.codec.spec import CodecSpec
from lynx.codec.stages import stage_codes, stage_levels


class Quantized(NamedTuple):
    """One tensor's codes and group parameters.

    Attributes:
        codes: one int32 ``[T, H, D]`` tensor per stage, anchor first.
        mn, scale: group minima and anchor steps in the scale dtype.
    """

    codes: tuple[torch.Tensor, ...]
    mn: torch.Tensor
    scale: torch.Tensor


def quantize_key(x: torch.Tensor, spec: CodecSpec) -> Quantized:
    """Quantize keys per channel over token blocks.

    Args:
        x: ``[T, H, D]`` float16/bfloat16/float32, finite, any strides.
        spec: codec configuration.

    Returns:
        ``codes`` (one ``[T, H, D]`` per stage); ``mn`` and ``scale``
        ``[G, H, D]`` with ``G = ceil(T / key_group_tokens)``.
    """
    check_values(x, spec, "key")
    values = x.float()
    tokens = values.shape[0]
    groups = num_key_groups(spec, tokens)
    padding = groups * spec.key_group_tokens - tokens
    padded = torch.cat([values, values[-1:].expand(padding, -1, -1)]) if padding else values
    blocks = padded.reshape(groups, spec.key_group_tokens, *values.shape[1:])
    mn, scale = _group_params(blocks.amin(dim=1), blocks.amax(dim=1), spec, "key")
    position = _position(values, _expand_key(mn, spec, tokens), _expand_key(scale, spec, tokens))
    return Quantized(tuple(stage_codes(position, spec.stage_bits)), mn, scale)


def quantize_value(x: torch.Tensor, spec: CodecSpec) -> Quantized:
    """Quantize values per token over channel groups of one head.

    Args:
        x: ``[T, H, D]`` float16/bfloat16/float32, finite, any strides;
            ``D`` a multiple of ``value_group_channels``.
        spec: codec configuration.

    Returns:
        ``codes`` (one ``[T, H, D]`` per stage); ``mn`` and ``scale``
        ``[T, H, Gv]`` with ``Gv = D / value_group_channels``.
    """
    check_values(x, spec, "value")
    values = x.float()
    tokens, heads, head_dim = values.shape
    groups = values.reshape(tokens, heads, head_dim // spec.value_group_channels, spec.value_group_channels)
    mn, scale = _group_params(groups.amin(dim=-1), groups.amax(dim=-1), spec, "value")
    position = _position(values, _expand_value(mn, spec), _expand_value(scale, spec))
    return Quantized(tuple(stage_codes(position, spec.stage_bits)), mn, scale)


def dequantize_key(
    codes: Sequence[torch.Tensor], mn: torch.Tensor, scale: torch.Tensor, spec: CodecSpec
) -> torch.Tensor:
    """Rebuild keys from the codes of their first stages.

    Args:
        codes: the first ``n`` stages' ``[T, H, D]`` codes (``1 <= n <=
            len(spec.stage_bits)``), as :func:`quantize_key` returns them.
        mn, scale: ``[G, H, D]`` as returned by :func:`quantize_key`.
        spec: codec configuration.

    Returns:
        ``[T, H, D]`` float32, ``mn + scale * level``.
    """
    tokens = _check_codes(codes, spec, "key").shape[0]
    expected = (num_key_groups(spec, tokens), *codes[0].shape[1:])
    _check_params(mn, scale, expected, "key")
    level = stage_levels(codes, spec.stage_bits)
    return _expand_key(mn, spec, tokens) + _expand_key(scale, spec, tokens) * level


def dequantize_value(
    codes: Sequence[torch.Tensor], mn: torch.Tensor, scale: torch.Tensor, spec: CodecSpec
) -> torch.Tensor:
    """Rebuild values from the codes of their first stages.

    Args:
        codes: the first ``n`` stages' ``[T, H, D]`` codes, ``D`` a multiple
            of ``value_group_channels``, as :func:`quantize_value` returns them.
        mn, scale: ``[T, H, Gv]`` as returned by :func:`quantize_value`.
        spec: codec configuration.

    Returns:
        ``[T, H, D]`` float32, ``mn + scale * level``.
    """
    tokens, heads, head_dim = _check_codes(codes, spec, "value").shape
    if head_dim % spec.value_group_channels:
        raise ValueError(f"value codes must be [T, H, D] with D a multiple of {spec.value_group_channels}")
    _check_params(mn, scale, (tokens, heads, head_dim // spec.value_group_channels), "value")
    level = stage_levels(codes, spec.stage_bits)
    return _expand_value(mn, spec) + _expand_value(scale, spec) * level


def check_values(x: torch.Tensor, spec: CodecSpec, name: str) -> None:
    """Raise ValueError unless ``x`` (the key or the value, ``name``) is a finite
    ``[T, H, D]`` tensor of an input dtype within the scale dtype's range.
    """
    if not isinstance(x, torch.Tensor) or x.dim() != 3:
        raise ValueError(f"{name} must be a [tokens, kv_heads, head_dim] tensor")
    if x.dtype not in INPUT_DTYPES:
        raise ValueError(f"{name} dtype must be one of {INPUT_DTYPES}, got {x.dtype}")
    check_shape(spec, *x.shape)
    peak = float(x.abs().amax()) if x.numel() else 0.0  # NaN if any is NaN, inf if any is infinite
    if not math.isfinite(peak):
        raise ValueError(f"{name} contains NaN or infinite values; the codec only encodes finite tensors")
    limit = torch.finfo(spec.torch_scale_dtype).max
    if peak > limit:
        raise ValueError(f"{name} has values beyond +-{limit}, the range of scale_dtype {spec.scale_dtype}")


def _group_params(
    lo: torch.Tensor, hi: torch.Tensor, spec: CodecSpec, name: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rounded (min, anchor step) in the scale dtype from float32 group min/max."""
    levels = (1 << spec.anchor_bits) - 1
    mn = round_down(lo, spec.torch_scale_dtype)
    scale = round_up(divide(hi - mn.float(), levels), spec.torch_scale_dtype)
    if not (bool(torch.isfinite(mn).all()) and bool(torch.isfinite(scale).all())):
        raise ValueError(
            f"{name} group minimum or scale overflows scale_dtype {spec.scale_dtype}; "
            "the value range is too wide for it"
        )
    return mn, scale


def _position(values: torch.Tensor, mn: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """float32 ``(values - mn) / scale`` per element, 0 where ``scale == 0``."""
    positive = scale > 0
    ratio = (values - mn) / torch.where(positive, scale, torch.ones_like(scale))
    return torch.where(positive, ratio, torch.zeros_like(ratio))


def _check_codes(codes: Sequence[torch.Tensor], spec: CodecSpec, name: str) -> torch.Tensor:
    """The anchor codes, once ``codes`` is known to be 1..len(stage_bits) tensors of one 3-D shape."""
    stages = len(spec.stage_bits)
    if isinstance(codes, torch.Tensor) or not 1 <= len(codes) <= stages:
        raise ValueError(f"{name} codes must be a sequence of 1..{stages} stage tensors")
    first = codes[0]
    if not isinstance(first, torch.Tensor) or first.dim() != 3:
        raise ValueError(f"{name} codes must be [T, H, D] tensors")
    if any(not isinstance(c, torch.Tensor) or c.shape != first.shape for c in codes):
        raise ValueError(f"{name} codes of every stage must share the shape {tuple(first.shape)}")
    return first


def _check_params(mn: torch.Tensor, scale: torch.Tensor, expected: tuple[int, ...], name: str) -> None:
    for label, tensor in (("minima", mn), ("scales", scale)):
        if tuple(tensor.shape) != expected:
            raise ValueError(f"{name} {label} must have shape {expected}, got {tuple(tensor.shape)}")


def _expand_key(param: torch.Tensor, spec: CodecSpec, tokens: int) -> torch.Tensor:
    """``[G, H, D]`` group parameter as float32 ``[T, H, D]``."""
    return param.float().repeat_interleave(spec.key_group_tokens, dim=0)[:tokens]


def _expand_value(param: torch.Tensor, spec: CodecSpec) -> torch.Tensor:
    """``[T, H, Gv]`` group parameter as float32 ``[T, H, D]``."""
    return param.float().repeat_interleave(spec.value_group_channels, dim=2)
