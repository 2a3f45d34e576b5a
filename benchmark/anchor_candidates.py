"""Anchor and residual designs measured beside the presets (``codec_quality.py --candidates``).

The anchor study compares 4-bit anchors at (nearly) equal anchor bytes,
decoded from the anchor alone; the residual study compares ways to refine a
4-bit anchor with 4 more bits, decoded from every stream. Designs the codec
can express (sink tokens, key group size) run through the real codec;
the others are simulated here in plain PyTorch with the codec's grouping and
its rounded FP16 minima and steps, and their bytes computed from what their
wire format would hold. Input is one layer's BF16 ``[T, H, D]`` K and V;
values are grouped per token over 64 channels, keys per channel over blocks
of 64 tokens (after any sink tokens).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from lynx.codec import CodecSpec, decode, encode
from lynx.codec.rounding import round_down, round_up

GROUP = 64
Decoder = Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
Quantizer = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class Candidate:
    """One design: what it is, its bytes per layer and how a layer decodes.

    Attributes:
        name: short label for tables.
        study: ``"anchor"`` (decoded from the anchor alone) or ``"residual"``
            (from every stream).
        spec: the codec spec whose streams (the anchor, or all) the design
            sends, plus ``extra_bytes`` in the anchor.
        decode: ``(key, value) -> (key', value')``, each ``[T, H, D]``.
        simulated: ``decode`` is a plain-PyTorch model of the design, not the codec.
        extra_bytes: anchor bytes per layer beyond ``spec``'s, as a function
            of (tokens, kv_heads, head_dim) for BF16 input.
        role: ``"baseline"`` (the design the study's deltas are against),
            ``"adopted"`` (what the codec does) or ``""``.
    """

    name: str
    study: str
    spec: CodecSpec
    decode: Decoder
    simulated: bool
    extra_bytes: Callable[[int, int, int], int] = lambda tokens, heads, dim: 0
    role: str = ""

    def __post_init__(self):
        if self.study not in ("anchor", "residual"):
            raise ValueError(f"study must be 'anchor' or 'residual', not {self.study!r}")
        if self.role not in ("", "baseline", "adopted"):
            raise ValueError(f"role must be '', 'baseline' or 'adopted', not {self.role!r}")


def candidates() -> list[Candidate]:
    """Every design, in table order."""
    plain, split = CodecSpec((4,), sink_tokens=0), CodecSpec((4, 4), sink_tokens=0)
    anchor = [
        Candidate("format 1 `int8` anchor: bit plane at bucket centre", "anchor", split, _bit_plane_anchor, True),
        _codec("plain 4-bit, no sinks", "anchor", plain, role="baseline"),
        *(_codec(f"{count} sink token{'s' * (count > 1)}", "anchor", CodecSpec((4,), sink_tokens=count))
          for count in (1, 2)),
        _codec("4 sink tokens", "anchor", CodecSpec((4,)), role="adopted"),
        *(_codec(f"{count} sink tokens", "anchor", CodecSpec((4,), sink_tokens=count)) for count in (8, 16)),
        Candidate("4 sink tokens as their own 4-bit key group, not raw", "anchor", plain,
                  _simulated(_grid(4), _grid(4), sinks=4, raw=False), True, _own_group_bytes(4)),
        _codec("key groups of 32 tokens", "anchor", CodecSpec((4,), key_group_tokens=32, sink_tokens=0)),
        _codec("key groups of 32 tokens, 4 sinks", "anchor", CodecSpec((4,), key_group_tokens=32)),
        Candidate("top-4 key channels (widest range per block and head) at 8 bits", "anchor", plain,
                  _simulated(_outlier_channels(4), _grid(4)), True, _outlier_bytes(4)),
        Candidate("top-8 key channels at 8 bits", "anchor", plain,
                  _simulated(_outlier_channels(8), _grid(4)), True, _outlier_bytes(8)),
        Candidate("top-4 key channels at 8 bits, 4 sinks", "anchor", CodecSpec((4,)),
                  _simulated(_outlier_channels(4), _grid(4), sinks=4), True, _outlier_bytes(4, sinks=4)),
        *(Candidate(f"4 sink tokens, the last {count} tokens raw", "anchor", CodecSpec((4,)),
                    _simulated(_grid(4), _grid(4), sinks=4, recent=count), True, _recent_bytes(count))
          for count in (16, 64)),
        Candidate("diagnostic: 4 sink tokens, 4-bit keys, BF16 values", "anchor", CodecSpec((4,)),
                  _simulated(_grid(4), _exact, sinks=4), True, _raw_instead(values=True)),
        Candidate("diagnostic: 4 sink tokens, BF16 keys, 4-bit values", "anchor", CodecSpec((4,)),
                  _simulated(_exact, _grid(4), sinks=4), True, _raw_instead(values=False)),
        *(Candidate(f"log grid ({kind}dense {where}, mu {mu})", "anchor", plain,
                    _simulated(_log_grid(mu, where), _log_grid(mu, where)), True)
          for kind, where, mu in (("mu-law, ", "centre", 3), ("", "centre", 8), ("", "ends", 3))),
    ]
    residual = [
        Candidate("8-bit grid, format 1 `int8`", "residual", split, _simulated(_grid(8), _grid(8)), True),
        Candidate("signed residual `r` in [−8, 7] at step `s/16` around the anchor, as QuantSpec", "residual",
                  split, _simulated(_signed(), _signed()), True),
        Candidate("16 centred sub-cells of every anchor cell", "residual", split,
                  _simulated(_centred(), _centred()), True),
        _codec("one-sided end cells (the codec's stages)", "residual", split),
        _codec("one-sided end cells, 4 sink tokens (the `int8` preset)", "residual", CodecSpec((4, 4)),
               role="adopted"),
    ]
    return anchor + residual


def _codec(name: str, study: str, spec: CodecSpec, role: str = "") -> Candidate:
    stages = 1 if study == "anchor" else spec.num_stages
    return Candidate(name, study, spec, lambda key, value: decode(encode(key, value, spec), stages), False,
                     role=role)


def _bit_plane_anchor(key: torch.Tensor, value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Format 1's anchor: the top 4 bits of a rounded 8-bit code, decoded at the bucket centre."""
    def anchor(x, lo, hi):
        mn, step = _params(lo, hi, 255)
        codes = torch.floor(_position(x, mn, step) + 0.5).clamp(0, 255)
        return mn + step * (torch.floor(codes / 16) * 16 + 7.5)
    return _simulated(anchor, anchor)(key, value)


def _simulated(key_quantizer: Quantizer, value_quantizer: Quantizer, sinks: int = 0, raw: bool = True,
               recent: int = 0) -> Decoder:
    """Decoder quantizing key blocks / value groups with the given functions ``(x, lo, hi) -> x'``.

    ``sinks`` leading tokens are kept exact (``raw``) or form their own key group (not ``raw``);
    the last ``recent`` tokens are kept exact (their key block still quantized with them).
    """
    def run(key: torch.Tensor, value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        k, v = key.float(), value.float()
        starts = [0, sinks] if sinks else [0]
        starts += list(range(sinks + GROUP, k.shape[0], GROUP))
        bounds = list(zip(starts, [*starts[1:], k.shape[0]]))
        out_k = torch.cat([key_quantizer(k[a:b], k[a:b].amin(0, keepdim=True), k[a:b].amax(0, keepdim=True))
                           for a, b in bounds if b > a])
        tokens, heads, dim = v.shape
        groups = v.reshape(tokens, heads, dim // GROUP, GROUP)
        out_v = value_quantizer(groups, groups.amin(-1, keepdim=True), groups.amax(-1, keepdim=True))
        out_v = out_v.reshape(tokens, heads, dim)
        if raw and sinks:
            out_k[:sinks], out_v[:sinks] = k[:sinks], v[:sinks]
        if recent:
            out_k[-recent:], out_v[-recent:] = k[-recent:], v[-recent:]
        return out_k.to(key.dtype), out_v.to(value.dtype)
    return run


def _params(lo: torch.Tensor, hi: torch.Tensor, levels: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The codec's rounded minimum and step (FP16) of groups with float32 ``lo``/``hi``, as float32."""
    mn = round_down(lo, torch.float16).float()
    return mn, round_up((hi - mn) / levels, torch.float16).float()


def _position(x: torch.Tensor, mn: torch.Tensor, step: torch.Tensor) -> torch.Tensor:
    return torch.where(step > 0, (x - mn) / torch.where(step > 0, step, 1.0), 0.0)


def _grid(bits: int) -> Quantizer:
    """Plain rounding to ``2^bits`` levels from the minimum to the maximum."""
    levels = (1 << bits) - 1
    def quantize(x, lo, hi):
        mn, step = _params(lo, hi, levels)
        return mn + step * torch.floor(_position(x, mn, step) + 0.5).clamp(0, levels)
    return quantize


def _exact(x: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor) -> torch.Tensor:
    """No quantization: the BF16 input (diagnostic designs splitting the anchor's error into K and V)."""
    return x


def _signed() -> Quantizer:
    """QuantSpec's residual: 4-bit anchor, then ``r`` in ``[-8, 7]`` at step ``s/16`` around it."""
    def quantize(x, lo, hi):
        mn, step = _params(lo, hi, 15)
        position = _position(x, mn, step)
        anchor = torch.floor(position + 0.5).clamp(0, 15)
        return mn + step * (anchor + torch.floor((position - anchor) * 16 + 0.5).clamp(-8, 7) / 16)
    return quantize


def _centred() -> Quantizer:
    """4-bit anchor, then 16 centred sub-cells of the anchor cell ``[a - 1/2, a + 1/2]``, ends included."""
    def quantize(x, lo, hi):
        mn, step = _params(lo, hi, 15)
        position = _position(x, mn, step)
        anchor = torch.floor(position + 0.5).clamp(0, 15)
        index = torch.floor((position - anchor) * 16 + 8).clamp(0, 15)
        return mn + step * (anchor + (index - 7.5) / 16)
    return quantize


def _outlier_channels(count: int) -> Quantizer:
    """Per key block and head, the ``count`` channels of widest range at 8 bits, the others at 4."""
    low, high = _grid(4), _grid(8)
    def quantize(x, lo, hi):
        widest = (hi - lo).topk(count, dim=-1).indices
        chosen = torch.zeros_like(hi, dtype=torch.bool).scatter_(-1, widest, True)
        return torch.where(chosen, high(x, lo, hi), low(x, lo, hi))
    return quantize


def _log_grid(mu: float, dense: str) -> Quantizer:
    """16 levels from the minimum to the maximum, spaced by a mu-law curve, nearest level."""
    u = torch.linspace(-1, 1, 16)
    if dense == "centre":
        curve = torch.sign(u) * ((1 + mu) ** u.abs() - 1) / mu
    else:
        curve = torch.sign(u) * torch.log1p(mu * u.abs()) / torch.log1p(torch.tensor(float(mu)))
    def quantize(x, lo, hi):
        mn = round_down(lo, torch.float16).float()
        half = (round_up(hi, torch.float16).float() - mn) / 2
        levels = (mn + half).unsqueeze(-1) + half.unsqueeze(-1) * curve
        nearest = (x.unsqueeze(-1) - levels).abs().argmin(-1, keepdim=True)
        return torch.gather(levels.expand(*x.shape, 16), -1, nearest).squeeze(-1)
    return quantize


def _own_group_bytes(sinks: int) -> Callable[[int, int, int], int]:
    """Extra key group of the sink tokens: FP16 minimum and step per channel."""
    def extra(tokens: int, heads: int, dim: int) -> int:
        groups = 1 + -(-(tokens - sinks) // GROUP) - -(-tokens // GROUP)
        return groups * heads * dim * 4
    return extra


def _recent_bytes(count: int) -> Callable[[int, int, int], int]:
    """The last ``count`` tokens raw (BF16, K and V) in place of their 4-bit codes and value parameters."""
    def extra(tokens: int, heads: int, dim: int) -> int:
        return count * heads * (3 * dim - dim // GROUP * 4)
    return extra


def _raw_instead(values: bool, sinks: int = 4) -> Callable[[int, int, int], int]:
    """Values (or keys) raw (BF16) instead of 4-bit codes and their FP16 minima and steps."""
    def extra(tokens: int, heads: int, dim: int) -> int:
        quantized = tokens - sinks
        params = quantized * heads * (dim // GROUP) * 4 if values else -(-quantized // GROUP) * heads * dim * 4
        return quantized * heads * dim * 3 // 2 - params
    return extra


def _outlier_bytes(count: int, sinks: int = 0) -> Callable[[int, int, int], int]:
    """Per key block and head: ``count`` channel indices (a byte each) and 4 more bits per element."""
    def extra(tokens: int, heads: int, dim: int) -> int:
        quantized = tokens - sinks
        return -(-quantized // GROUP) * heads * count + quantized * heads * count * 4 // 8
    return extra
