"""`lynx_deploy.estimate` fed with this run's measurements, checked against the measured rows, then at cluster scale.

CPU check: for every measured speed row the estimator gets the model's KV
geometry, the prompt length, the link rate, the prefill throughput measured
in the same run (`bf16` calibration), the codec's encode and decode rates
measured here on the model's own KV shape, and one pipeline unit per layer
of each prefill chunk (Lynx streams layer by layer on the CPU platform; the
stock backend, one unit per chunk); its overlapped TTFT is set beside the
measured one.

Cluster scale (an estimate, nothing measured): Llama-3.1-8B and 70B, 8k-128k
tokens, 10-400 Gbit/s, compute-bound prefill at an assumed effective rate,
SGLang's 8,192-token prefill chunks, codec time not counted (the GPU
kernels' throughput is not measured yet).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence

import torch

from evaluation.plan import CHUNK_TOKENS, VARIANTS
from lynx_deploy.estimate import (
    COMPUTE_SHAPES,
    GEOMETRIES,
    KVGeometry,
    Scenario,
    chunk_units,
    estimate,
    prefill_tok_s_from_flops,
)
from lynx.kvwire import KVShape, WireFormat

CLUSTER_MODELS = {
    # name: (assumed effective prefill TFLOP/s, what it stands for)
    "llama-3.1-8b": (400.0, "one H100-class GPU at about 40% of its dense bf16 peak"),
    "llama-3.1-70b": (2400.0, "8 GPUs in tensor parallel at about 30% of their peak"),
}
CLUSTER_TOKENS = (8192, 32768, 131072)
CLUSTER_GBPS = (10.0, 25.0, 100.0, 400.0)
CLUSTER_CHUNK = 8192
CLUSTER_MODES = (("bf16", "int8"), ("int8", "int8"), ("int4", "int8"), ("lynx", "int8"), ("lynx", "2+6"))


def codec_rates(geometry: KVGeometry, tokens: int, repeats: int = 3) -> dict[str, dict]:
    """Encode and decode GB/s (of the KV as stored) per variant's wire format, on `tokens` tokens of this shape.

    One layer is timed (median of `repeats`), as the servers do it: gather-encode
    from a pool by slot, scatter-decode every stream into one.
    """
    generator = torch.Generator().manual_seed(0)
    k = torch.randn(tokens, geometry.kv_heads, geometry.head_dim, generator=generator).to(geometry.torch_dtype)
    v = torch.randn(tokens, geometry.kv_heads, geometry.head_dim, generator=generator).to(geometry.torch_dtype)
    slots = torch.arange(tokens, dtype=torch.int64)
    shape = KVShape(1, tokens, geometry.kv_heads, geometry.head_dim, geometry.torch_dtype)
    layer_bytes = geometry.raw_bytes(tokens) / geometry.num_layers
    out = {}
    for name in ("int8", "int4", "lynx", "lynx-2+6"):
        variant = VARIANTS[name]
        wire = WireFormat.for_mode(variant.mode, variant.preset)
        encode_s, decode_s = [], []
        for _ in range(repeats):
            start = time.perf_counter()
            streams = wire.encode([k], [v], slots)
            encode_s.append(time.perf_counter() - start)
            start = time.perf_counter()
            wire.write(streams, shape, [k.clone()], [v.clone()], slots)
            decode_s.append(time.perf_counter() - start)
        out[name] = {
            "encode_gbps": layer_bytes / statistics.median(encode_s) / 1e9,
            "decode_gbps": layer_bytes / statistics.median(decode_s) / 1e9,
        }
    return out


def _mode(variant: str) -> tuple[str, str]:
    v = VARIANTS[variant]
    return v.mode, v.preset


def cpu_pipeline_units(geometry: KVGeometry, tokens: int, stock: bool) -> int:
    """Pipeline units of a measured row: per prefill chunk, and for Lynx per layer of each chunk.

    On the CPU platform Lynx streams a segment layer by layer while the forward
    that completes it runs (docs/SERVING.md), so its link starts one layer's
    compute after the prefill; SGLang's stock Mooncake backend sends a chunk's
    KV after the chunk.
    """
    chunks = chunk_units(tokens, CHUNK_TOKENS)
    return chunks if stock else chunks * geometry.num_layers


def check_rows(geometry: KVGeometry, rows: Sequence[dict], prefill_s: float, rates: dict[str, dict]) -> list[dict]:
    """Per measured row: the estimator's overlapped TTFT (and all-streams time) beside the measured ones."""
    out = []
    for row in rows:
        mode, preset = _mode(row["variant"])
        tokens = row["prompt_tokens"]
        codec = rates.get(row["variant"], {})
        scenario = Scenario(
            tokens, row["link_gbps"], tokens / prefill_s,
            codec.get("encode_gbps", float("inf")), codec.get("decode_gbps", float("inf")),
            pipeline_units=cpu_pipeline_units(geometry, tokens, stock=VARIANTS[row["variant"]].stock),
        )  # fmt: skip
        est = estimate(geometry, scenario, mode, preset)
        entry = {
            "kind": "estimate vs measured",
            "model": row["model"],
            "variant": row["variant"],
            "link_gbps": row["link_gbps"],
            "prompt_tokens": tokens,
            "bf16_transfer_to_prefill": row["bf16_transfer_to_prefill"],
            "estimated_ttft_s": est.ttft_overlapped_s,
            "measured_ttft_s": row.get("t1_s"),
        }
        if row.get("t1_s"):
            entry["estimate_over_measured"] = est.ttft_overlapped_s / row["t1_s"]
        if mode == "lynx" and row.get("residual_ready_s"):
            entry["estimated_all_streams_s"] = est.all_streams_overlapped_s
            entry["measured_residual_ready_s"] = row["residual_ready_s"]
        out.append(entry)
    return out


def cluster_table() -> list[dict]:
    """Estimated TTFT per model, prompt length, link rate and mode at cluster scale (labelled estimates)."""
    out = []
    for model, (tflops, _) in CLUSTER_MODELS.items():
        geometry = GEOMETRIES[model]
        params, d_model = COMPUTE_SHAPES[model]
        for tokens in CLUSTER_TOKENS:
            rate = prefill_tok_s_from_flops(params, d_model, geometry.num_layers, tokens, tflops)
            for gbps in CLUSTER_GBPS:
                scenario = Scenario(tokens, gbps, rate, pipeline_units=chunk_units(tokens, CLUSTER_CHUNK))
                for mode, preset in CLUSTER_MODES:
                    est = estimate(geometry, scenario, mode, preset)
                    out.append({
                        "kind": "estimate", "model": model, "tokens": tokens, "link_gbps": gbps,
                        "mode": mode if mode != "lynx" or preset == "int8" else f"lynx-{preset}",
                        "prefill_s": est.prefill_s, "transfer_to_prefill": est.transfer_to_prefill,
                        "bf16_transfer_to_prefill": geometry.raw_bytes(tokens) * 8 / (gbps * 1e9) / est.prefill_s,
                        "ttft_s": est.ttft_overlapped_s, "all_streams_s": est.all_streams_overlapped_s,
                    })  # fmt: skip
    return out


def cluster_ratios(table: Sequence[dict]) -> list[dict]:
    """Per (model, tokens, rate): int8 / lynx and lynx / int4 estimated TTFT."""
    index = {(r["model"], r["tokens"], r["link_gbps"], r["mode"]): r["ttft_s"] for r in table}
    out = []
    for (model, tokens, gbps, mode), ttft in index.items():
        if mode != "lynx":
            continue
        out.append({
            "model": model, "tokens": tokens, "link_gbps": gbps,
            "int8_over_lynx": index[(model, tokens, gbps, "int8")] / ttft,
            "lynx_over_int4": ttft / index[(model, tokens, gbps, "int4")],
            "bf16_over_lynx": index[(model, tokens, gbps, "bf16")] / ttft,
        })  # fmt: skip
    return out
