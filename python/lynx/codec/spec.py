"""Codec configuration: stage bit widths, group sizes, presets and byte accounting."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from lynx.checks import is_int
from lynx.codec import layout

SCALE_DTYPES = ("float16", "bfloat16")
MAX_TOTAL_BITS = 16
DEFAULT_SINK_TOKENS = 4


@dataclass(frozen=True)
class CodecSpec:
    """How one layer's K and V are quantized and split into stages.

    Attributes:
        stage_bits: bit width of each quantized stage, coarsest first. Stage 0
            is the anchor, a rounded quantization at its own width; each later
            stage refines the cell the stages before it left (see
            :mod:`lynx.codec.stages`). Their sum ``total_bits`` is in 1..16.
        key_group_tokens: keys share a min/scale per (kv_head, channel) over
            blocks of this many consecutive quantized tokens (the last block
            may be shorter).
        value_group_channels: values share a min/scale per token over groups
            of this many consecutive channels of one head; ``head_dim`` must
            be a multiple of it.
        scale_dtype: wire dtype of the per-group minimum and scale,
            ``"float16"`` or ``"bfloat16"``.
        raw_residual: append a last stream holding the input tensors' raw
            bytes, so decoding every stage is bit-exact. Requires exactly one
            quantized stage.
        sink_tokens: the first this many tokens (attention sinks) travel raw,
            in the input dtype, in the anchor, and are exact from the anchor
            on; the tokens after them are quantized.
    """

    stage_bits: tuple[int, ...]
    key_group_tokens: int = 64
    value_group_channels: int = 64
    scale_dtype: str = "float16"
    raw_residual: bool = False
    sink_tokens: int = DEFAULT_SINK_TOKENS

    def __post_init__(self) -> None:
        if isinstance(self.stage_bits, (str, bytes)) or not hasattr(self.stage_bits, "__iter__"):
            raise ValueError(f"stage_bits must be a sequence of ints, got {self.stage_bits!r}")
        bits = tuple(self.stage_bits)
        object.__setattr__(self, "stage_bits", bits)
        if not bits:
            raise ValueError("stage_bits must name at least one stage (the anchor)")
        for width in bits:
            if not is_int(width) or width < 1:
                raise ValueError(f"every stage width must be an int >= 1, got stage_bits={bits}")
        if sum(bits) > MAX_TOTAL_BITS:
            raise ValueError(f"total bits {sum(bits)} of stage_bits={bits} exceed {MAX_TOTAL_BITS}")
        for name in ("key_group_tokens", "value_group_channels"):
            size = getattr(self, name)
            if not is_int(size) or size < 1:
                raise ValueError(f"{name} must be a positive int, got {size!r}")
        if self.scale_dtype not in SCALE_DTYPES:
            raise ValueError(f"scale_dtype must be one of {SCALE_DTYPES}, got {self.scale_dtype!r}")
        if not is_int(self.sink_tokens) or self.sink_tokens < 0:
            raise ValueError(f"sink_tokens must be an int >= 0, got {self.sink_tokens!r}")
        if not isinstance(self.raw_residual, bool):
            raise ValueError(f"raw_residual must be a bool, got {self.raw_residual!r}")
        if self.raw_residual and len(bits) != 1:
            raise ValueError(
                f"raw_residual needs exactly one quantized stage (the anchor), got stage_bits={bits}"
            )

    @property
    def total_bits(self) -> int:
        """Bits per quantized element, all quantized stages together."""
        return sum(self.stage_bits)

    @property
    def anchor_bits(self) -> int:
        """Bits per element carried by the anchor (stage 0)."""
        return self.stage_bits[0]

    @property
    def num_quantized_stages(self) -> int:
        """Number of streams carrying quantized codes."""
        return len(self.stage_bits)

    @property
    def num_stages(self) -> int:
        """Number of streams on the wire, the raw residual included."""
        return len(self.stage_bits) + (1 if self.raw_residual else 0)

    @property
    def torch_scale_dtype(self) -> torch.dtype:
        """``scale_dtype`` as a torch dtype."""
        return getattr(torch, self.scale_dtype)

    @classmethod
    def preset(cls, name: str) -> CodecSpec:
        """The named preset (see :meth:`preset_names`), or stage widths written ``"2+6"``."""
        for preset_name, kwargs in _presets():
            if preset_name == name:
                return cls(**kwargs)
        parts = name.split("+") if isinstance(name, str) else []
        if len(parts) > 1 and all(p.isdigit() for p in parts):
            return cls(stage_bits=tuple(int(p) for p in parts))
        raise ValueError(
            f"unknown codec preset {name!r}; use one of {', '.join(cls.preset_names())} "
            "or stage widths such as 2+6 or 2+2+4"
        )

    @staticmethod
    def preset_names() -> tuple[str, ...]:
        """Names accepted by :meth:`preset`, default first."""
        return tuple(name for name, _ in _presets())

    def stream_bytes(
        self, num_tokens: int, kv_heads: int, head_dim: int, dtype: torch.dtype = torch.bfloat16
    ) -> tuple[int, ...]:
        """Exact byte length of each stream for one (key, value) pair.

        Args:
            num_tokens, kv_heads, head_dim: shape ``[num_tokens, kv_heads, head_dim]``
                of the key and of the value.
            dtype: input dtype; only the raw residual's size depends on it.

        Returns:
            One length per stream, anchor first (``num_stages`` entries).
        """
        return layout.stream_bytes(self, num_tokens, kv_heads, head_dim, dtype)

    def bytes_per_token(
        self, kv_heads: int, head_dim: int, dtype: torch.dtype = torch.bfloat16
    ) -> tuple[float, ...]:
        """Bytes each further quantized token adds to each stream, K and V
        together, counted in whole key groups: for ``T = sink_tokens + m *
        key_group_tokens`` tokens, ``stream_bytes`` is the sink tokens' raw
        bytes (anchor only) plus ``T - sink_tokens`` times this.
        """
        return layout.bytes_per_token(self, kv_heads, head_dim, dtype)


def _presets() -> tuple[tuple[str, dict], ...]:
    return (
        ("int8", {"stage_bits": (4, 4)}),
        ("int16", {"stage_bits": (4, 12)}),
        ("int4", {"stage_bits": (4,)}),
        ("bf16-exact", {"stage_bits": (4,), "raw_residual": True}),
    )
