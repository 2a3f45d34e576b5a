"""Asymmetric min/scale quantization with KIVI grouping.

Keys share a minimum and scale per (kv_head, channel) over blocks of
``key_group_tokens`` tokens; values per (token, kv_head) over groups of
``value_group_channels`` channels. For a group with ``b = total_bits`` and
``L = 2^b - 1`` levels, computed in float32:

* ``mn = round_down(min)`` and ``scale = round_up((max - mn) / L)`` in the
  scale dtype, so the receiver's grid ``mn + scale * [0, L]`` covers the group;
* ``q = clamp(floor((x - mn) / scale + 0.5), 0, L)`` with the rounded ``mn``
  and ``scale`` (round half up); ``q = 0`` where ``scale == 0``;
* with the top ``p`` bits of ``q`` known (``r = b - p`` unknown):
  ``x' = mn + scale * ((prefix << r) + (2^r - 1) / 2)``, the bucket centre;
  with every bit ``x' = mn + scale * q``, so ``|x' - x| <= scale / 2``.
"""

from __future__ import annotations

import torch

from lynx.codec.layout import INPUT_DTYPES, check_shape, num_key_groups
from lynx.codec.rounding import round_down, round_up
from lynx.codec.spec import CodecSpec


def quantize_key(x: torch.Tensor, spec: CodecSpec) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Quantize keys per channel over token blocks.

    Args:
        x: ``[T, H, D]`` float16/bfloat16/float32, finite, any strides.
        spec: codec configuration.

    Returns:
        ``codes`` int32 ``[T, H, D]`` in ``[0, 2^b)``; ``mn`` and ``scale`` in
        the scale dtype, ``[G, H, D]`` with ``G = ceil(T / key_group_tokens)``.
    """
    _check_input(x, spec, "key")
    values = x.float()
    tokens = values.shape[0]
    groups = num_key_groups(spec, tokens)
    padding = groups * spec.key_group_tokens - tokens
    padded = torch.cat([values, values[-1:].expand(padding, -1, -1)]) if padding else values
    blocks = padded.reshape(groups, spec.key_group_tokens, *values.shape[1:])
    mn, scale = _group_params(blocks.amin(dim=1), blocks.amax(dim=1), spec, "key")
    codes = _codes(values, _expand_key(mn, spec, tokens), _expand_key(scale, spec, tokens), spec)
    return codes, mn, scale


def quantize_value(x: torch.Tensor, spec: CodecSpec) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Quantize values per token over channel groups of one head.

    Args:
        x: ``[T, H, D]`` float16/bfloat16/float32, finite, any strides;
            ``D`` a multiple of ``value_group_channels``.
        spec: codec configuration.

    Returns:
        ``codes`` int32 ``[T, H, D]`` in ``[0, 2^b)``; ``mn`` and ``scale`` in
        the scale dtype, ``[T, H, Gv]`` with ``Gv = D / value_group_channels``.
    """
    _check_input(x, spec, "value")
    values = x.float()
    tokens, heads, head_dim = values.shape
    groups = values.reshape(tokens, heads, head_dim // spec.value_group_channels, spec.value_group_channels)
    mn, scale = _group_params(groups.amin(dim=-1), groups.amax(dim=-1), spec, "value")
    codes = _codes(values, _expand_value(mn, spec), _expand_value(scale, spec), spec)
    return codes, mn, scale


def dequantize_key(
    codes: torch.Tensor, mn: torch.Tensor, scale: torch.Tensor, spec: CodecSpec, known_bits: int | None = None
) -> torch.Tensor:
    """Rebuild keys from the top ``known_bits`` bits of their codes.

    Args:
        codes: ``[T, H, D]`` integer prefixes, ``known_bits`` bits each.
        mn, scale: ``[G, H, D]`` as returned by :func:`quantize_key`.
        spec: codec configuration.
        known_bits: bits known per code, 1..total_bits; default all.

    Returns:
        ``[T, H, D]`` float32; unknown low bits are replaced by the centre of
        their bucket.
    """
    tokens = codes.shape[0]
    expected = (num_key_groups(spec, tokens), *codes.shape[1:])
    _check_params(codes, mn, scale, expected, "key")
    level = _level(codes, spec, known_bits)
    return _expand_key(mn, spec, tokens) + _expand_key(scale, spec, tokens) * level


def dequantize_value(
    codes: torch.Tensor, mn: torch.Tensor, scale: torch.Tensor, spec: CodecSpec, known_bits: int | None = None
) -> torch.Tensor:
    """Rebuild values from the top ``known_bits`` bits of their codes.

    Args:
        codes: ``[T, H, D]`` integer prefixes, ``known_bits`` bits each.
        mn, scale: ``[T, H, Gv]`` as returned by :func:`quantize_value`.
        spec: codec configuration.
        known_bits: bits known per code, 1..total_bits; default all.

    Returns:
        ``[T, H, D]`` float32; unknown low bits are replaced by the centre of
        their bucket.
    """
    if codes.dim() != 3 or codes.shape[2] % spec.value_group_channels:
        raise ValueError(f"value codes must be [T, H, D] with D a multiple of {spec.value_group_channels}")
    tokens, heads, head_dim = codes.shape
    _check_params(codes, mn, scale, (tokens, heads, head_dim // spec.value_group_channels), "value")
    level = _level(codes, spec, known_bits)
    return _expand_value(mn, spec) + _expand_value(scale, spec) * level


def _check_input(x: torch.Tensor, spec: CodecSpec, name: str) -> None:
    if not isinstance(x, torch.Tensor) or x.dim() != 3:
        raise ValueError(f"{name} must be a [tokens, kv_heads, head_dim] tensor")
    if x.dtype not in INPUT_DTYPES:
        raise ValueError(f"{name} dtype must be one of {INPUT_DTYPES}, got {x.dtype}")
    check_shape(spec, *x.shape)
    if not bool(torch.isfinite(x).all()):
        raise ValueError(f"{name} contains NaN or infinite values; the codec only encodes finite tensors")
    limit = torch.finfo(spec.torch_scale_dtype).max
    if float(x.abs().max()) > limit:
        raise ValueError(f"{name} has values beyond +-{limit}, the range of scale_dtype {spec.scale_dtype}")


def _group_params(
    lo: torch.Tensor, hi: torch.Tensor, spec: CodecSpec, name: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rounded (min, scale) in the scale dtype from float32 group min/max."""
    levels = (1 << spec.total_bits) - 1
    mn = round_down(lo, spec.torch_scale_dtype)
    scale = round_up((hi - mn.float()) / levels, spec.torch_scale_dtype)
    if not (bool(torch.isfinite(mn).all()) and bool(torch.isfinite(scale).all())):
        raise ValueError(
            f"{name} group minimum or scale overflows scale_dtype {spec.scale_dtype}; "
            "the value range is too wide for it"
        )
    return mn, scale


def _codes(values: torch.Tensor, mn: torch.Tensor, scale: torch.Tensor, spec: CodecSpec) -> torch.Tensor:
    """int32 codes of float32 ``values`` given per-element float32 ``mn``/``scale``."""
    positive = scale > 0
    ratio = (values - mn) / torch.where(positive, scale, torch.ones_like(scale))
    codes = torch.floor(ratio + 0.5).clamp_(0, (1 << spec.total_bits) - 1)
    return torch.where(positive, codes, torch.zeros_like(codes)).to(torch.int32)


def _level(codes: torch.Tensor, spec: CodecSpec, known_bits: int | None) -> torch.Tensor:
    """Grid level ``(prefix << r) + (2^r - 1) / 2`` as float32."""
    known = spec.total_bits if known_bits is None else known_bits
    if not isinstance(known, int) or not 1 <= known <= spec.total_bits:
        raise ValueError(f"known_bits must be an int in 1..{spec.total_bits}, got {known_bits!r}")
    unknown = spec.total_bits - known
    return codes.float() * float(1 << unknown) + ((1 << unknown) - 1) / 2


def _check_params(
    codes: torch.Tensor, mn: torch.Tensor, scale: torch.Tensor, expected: tuple[int, ...], name: str
) -> None:
    if codes.dim() != 3:
        raise ValueError(f"{name} codes must be [T, H, D], got shape {tuple(codes.shape)}")
    for label, tensor in (("minima", mn), ("scales", scale)):
        if tuple(tensor.shape) != expected:
            raise ValueError(f"{name} {label} must have shape {expected}, got {tuple(tensor.shape)}")


def _expand_key(param: torch.Tensor, spec: CodecSpec, tokens: int) -> torch.Tensor:
    """``[G, H, D]`` group parameter as float32 ``[T, H, D]``."""
    return param.float().repeat_interleave(spec.key_group_tokens, dim=0)[:tokens]


def _expand_value(param: torch.Tensor, spec: CodecSpec) -> torch.Tensor:
    """``[T, H, Gv]`` group parameter as float32 ``[T, H, D]``."""
    return param.float().repeat_interleave(spec.value_group_channels, dim=2)
