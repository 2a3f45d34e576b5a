"""Cluster-scale TTFT estimate per `--lynx-mode`, from KV geometry, link rate and measured rates.

Every figure this module prints is an **estimate**: a model fed with
measured pieces (prefill throughput, codec throughput), not a measurement.

Notation: L layers, H KV heads, D head dim, b bytes per KV element, T prompt
tokens, R link rate (Gbit/s), P prefill throughput (tokens/s), E and Dq the
codec's encode and decode throughput (GB/s of the KV as stored, the unit of
``benchmark/codec_throughput.py``), N pipeline units (layers by default).

    B_raw  = L * T * 2 * H * D * b                 KV as stored, bytes
    B_s    = L * stream_bytes_s(T)                 stream s of the mode's wire format, bytes
                                                   (from CodecSpec; ~ L * T * bytes_per_token_s)
    B_crit, the bytes decoding waits for:
        bf16  B_0 = B_raw, the KV as stored (one stream, no codec)
        int8  B_0, its one stream (the int8 preset's stages joined): all of it
        int4  B_0, the 4-bit anchor (lossy; there is no residual)
        lynx  B_0, the anchor; the residual streams follow off the critical path
    t_p = T / P        t_e = B_raw / E        t_x = 8 * B_crit / (R * 1e9)        t_d = B_raw / Dq
                       (t_e = t_d = 0 in bf16 mode: no codec)

    sequential (transfer after prefill):  TTFT = t_p + t_e + t_x + t_d + t_step
    overlapped (N-unit pipeline):         TTFT = max(t_p, t_e, t_x, t_d) * (N - 1) / N
                                                 + (t_p + t_e + t_x + t_d) / N + t_step

The overlapped form is a flow shop of N equal units (layers or chunks)
through prefill, encode, link and decode: the slowest stage dominates
(``max(prefill, transfer)``) and the others add one unit each as a tail.
It is how a chunked prefill serves: SGLang computes ``--chunked-prefill-size``
tokens C per forward pass and Lynx encodes and sends each chunk's KV
(``--lynx-segment-tokens``) while the next is computed, so
``N = chunk_units(T, C) = round(T / C)``; an unchunked prefill sends after
the last layer (the sequential form, or N = layers where a backend sends per
layer).

Prefill throughput at cluster scale, when not measured, comes from compute:
a prefill is compute-bound, each token costs ``2 * params`` FLOPs in the
weights plus ``2 * L * d_model * T`` in causal attention (on average T/2
earlier tokens, QK and AV), so ``P(T) = F / (2 * params + 2 * L * d_model * T)``
for an effective rate F (FLOP/s actually sustained; `prefill_tok_s_from_flops`).
``t_step`` is one decode step. For `lynx` mode the time at which every stream
has landed (verified output may flow) is the same formula with ``B_crit``
replaced by the sum of all streams, and no ``t_d``. Not modelled: attention's
growth of prefill cost with T (pass P measured at that length), anchor
preemption latency of one residual chunk, protocol overheads, queueing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from lynx.kvwire import KVShape, WireFormat
from lynx_deploy.models import QWEN2, SMOLLM2

MODES = ("bf16", "int8", "int4", "lynx")
DTYPES = ("bfloat16", "float16", "float32")


@dataclass(frozen=True)
class KVGeometry:
    """Shape of a model's KV cache: per layer and token, K and V are ``[kv_heads, head_dim]``."""

    name: str
    num_layers: int
    kv_heads: int
    head_dim: int
    dtype: str = "bfloat16"

    def __post_init__(self) -> None:
        for field in ("num_layers", "kv_heads", "head_dim"):
            value = getattr(self, field)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{field} must be a positive int, got {value!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}, got {self.dtype!r}")

    @property
    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, self.dtype)

    @property
    def dtype_bytes(self) -> int:
        return self.torch_dtype.itemsize

    def raw_bytes(self, tokens: int) -> int:
        """Bytes of `tokens` tokens of KV as stored, all layers, K and V."""
        return self.num_layers * tokens * 2 * self.kv_heads * self.head_dim * self.dtype_bytes


# Parameters and hidden size, for the compute-bound prefill rate (`prefill_tok_s_from_flops`).
COMPUTE_SHAPES = {
    "llama-3.1-8b": (8.03e9, 4096),
    "llama-3.1-70b": (70.6e9, 8192),
    "smollm2-135m": (1.35e8, 576),
    "qwen2.5-coder-0.5b": (4.94e8, 896),
}

GEOMETRIES = {
    g.name: g
    for g in (
        KVGeometry("llama-3.1-8b", 32, 8, 128),
        KVGeometry("llama-3.1-70b", 80, 8, 128),
        KVGeometry("smollm2-135m", SMOLLM2.num_layers, SMOLLM2.kv_heads, SMOLLM2.head_dim),
        KVGeometry("qwen2.5-coder-0.5b", QWEN2.num_layers, QWEN2.kv_heads, QWEN2.head_dim),
    )
}


@dataclass(frozen=True)
class Scenario:
    """One prompt on one link with measured rates.

    Attributes:
        tokens: prompt length T.
        link_gbps: link rate R, Gbit/s (1e9 bits per second).
        prefill_tok_s: prefill throughput P, tokens per second.
        encode_gbps, decode_gbps: codec throughput, GB/s (1e9 bytes) of KV as
            stored; ``math.inf`` leaves the codec's time out.
        decode_step_s: seconds of one decode step.
        pipeline_units: N of the overlapped form; None means one per layer.
    """

    tokens: int
    link_gbps: float
    prefill_tok_s: float
    encode_gbps: float = math.inf
    decode_gbps: float = math.inf
    decode_step_s: float = 0.0
    pipeline_units: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.tokens, int) or isinstance(self.tokens, bool) or self.tokens < 1:
            raise ValueError(f"tokens must be a positive int, got {self.tokens!r}")
        for field in ("link_gbps", "prefill_tok_s", "encode_gbps", "decode_gbps"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(f"{field} must be a number > 0, got {value!r}")
        if not isinstance(self.decode_step_s, (int, float)) or not 0 <= self.decode_step_s < math.inf:
            raise ValueError(f"decode_step_s must be a finite number >= 0, got {self.decode_step_s!r}")
        units = self.pipeline_units
        if units is not None and (not isinstance(units, int) or isinstance(units, bool) or units < 1):
            raise ValueError(f"pipeline_units must be a positive int or None, got {units!r}")


@dataclass(frozen=True)
class ModeEstimate:
    """Estimated TTFT of one mode (seconds; bytes for the whole prompt, all layers)."""

    mode: str
    tokens: int
    link_gbps: float
    stream_bytes_per_token: tuple[float, ...]
    critical_bytes: int
    total_bytes: int
    prefill_s: float
    encode_s: float
    transfer_s: float
    decode_s: float
    ttft_sequential_s: float
    ttft_overlapped_s: float
    all_streams_sequential_s: float
    all_streams_overlapped_s: float

    @property
    def transfer_to_prefill(self) -> float:
        """Ratio of the critical transfer's time to the prefill's."""
        return self.transfer_s / self.prefill_s


def prefill_tok_s_from_flops(params: float, d_model: int, num_layers: int, tokens: int, tflops: float) -> float:
    """Compute-bound prefill throughput (tokens/s) of a `tokens`-token prompt at `tflops` effective TFLOP/s."""
    if min(params, d_model, num_layers, tokens, tflops) <= 0:
        raise ValueError("params, d_model, num_layers, tokens and tflops must all be > 0")
    return tflops * 1e12 / (2 * params + 2 * num_layers * d_model * tokens)


def chunk_units(tokens: int, chunk_tokens: int) -> int:
    """Pipeline units of a prefill chunked every `chunk_tokens` tokens (a stub of a last chunk counts as none)."""
    if tokens < 1 or chunk_tokens < 1:
        raise ValueError(f"tokens and chunk_tokens must be >= 1, got {tokens}, {chunk_tokens}")
    return max(1, math.floor(tokens / chunk_tokens + 0.5))


def sequential_s(stages: tuple[float, ...], step_s: float) -> float:
    """Stages one after another, then one decode step."""
    return sum(stages) + step_s


def overlapped_s(stages: tuple[float, ...], units: int, step_s: float) -> float:
    """N-unit flow shop: ``max(stages) * (N - 1) / N + sum(stages) / N``, then one decode step."""
    return max(stages) * (units - 1) / units + sum(stages) / units + step_s


def mode_streams(
    geometry: KVGeometry, tokens: int, mode: str, preset: str
) -> tuple[tuple[int, ...], tuple[float, ...]]:
    """Bytes of each stream for the whole prompt, and bytes per token of each stream (all layers).

    Both come from the codec (`WireFormat`, `CodecSpec`); bf16 is the KV as stored.
    """
    wire = WireFormat.for_mode(mode, preset)
    shape = KVShape(geometry.num_layers, tokens, geometry.kv_heads, geometry.head_dim, geometry.torch_dtype)
    per_layer = wire.layer_stream_bytes(shape)
    if wire.spec is None:
        per_token = (float(2 * geometry.kv_heads * geometry.head_dim * geometry.dtype_bytes),)
    else:
        per_token = wire.spec.bytes_per_token(geometry.kv_heads, geometry.head_dim, geometry.torch_dtype)
        if wire.num_streams == 1:  # stages joined into one stream (int8 mode)
            per_token = (sum(per_token),)
    layers = geometry.num_layers
    return tuple(layers * b for b in per_layer), tuple(layers * b for b in per_token)


def estimate(geometry: KVGeometry, scenario: Scenario, mode: str, preset: str = "int8") -> ModeEstimate:
    """The estimate of one mode (`preset` is the codec of `lynx` mode); see the module docstring."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    streams, per_token = mode_streams(geometry, scenario.tokens, mode, preset)
    critical = streams[0] if mode in ("int4", "lynx") else sum(streams)
    raw = geometry.raw_bytes(scenario.tokens)
    prefill = scenario.tokens / scenario.prefill_tok_s
    encode = 0.0 if mode == "bf16" else raw / (scenario.encode_gbps * 1e9)
    decode = 0.0 if mode == "bf16" else raw / (scenario.decode_gbps * 1e9)
    link = scenario.link_gbps * 1e9 / 8
    transfer, transfer_all = critical / link, sum(streams) / link
    units = scenario.pipeline_units or geometry.num_layers
    step = scenario.decode_step_s
    stages, all_stages = (prefill, encode, transfer, decode), (prefill, encode, transfer_all)
    return ModeEstimate(
        mode=mode,
        tokens=scenario.tokens,
        link_gbps=scenario.link_gbps,
        stream_bytes_per_token=per_token,
        critical_bytes=critical,
        total_bytes=sum(streams),
        prefill_s=prefill,
        encode_s=encode,
        transfer_s=transfer,
        decode_s=decode,
        ttft_sequential_s=sequential_s(stages, step),
        ttft_overlapped_s=overlapped_s(stages, units, step),
        all_streams_sequential_s=sequential_s(all_stages, 0.0),
        all_streams_overlapped_s=overlapped_s(all_stages, units, 0.0),
    )
