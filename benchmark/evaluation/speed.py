"""Time to the 1st and N-th token per variant and link rate, with `benchmark/ttft_sweep.py`'s requests and summaries.

Within one deployment the link rates are interleaved (repeat 1 at every
rate, then repeat 2 ...), so the machine's drift hits every rate alike. The
prompts are `ttft_sweep`'s (chat-templated essay text, greedy,
``ignore_eos``), the same in every variant.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Sequence

import ttft_sweep
from evaluation.deployments import http_ports
from evaluation.link import ShapedLoopback
from evaluation.plan import ModelPlan, Variant
from lynx_deploy.estimate import KVGeometry
from lynx.kvwire import KVShape, WireFormat


def calibrate(pd, tokenizer, tokens: int) -> float:
    """Seconds the prefill server takes to answer a `tokens`-token prompt, link unshaped."""
    return ttft_sweep.prefill_seconds(pd, tokenizer, tokens)


def rates_for(geometry: KVGeometry, tokens: int, prefill_s: float, ratios: Sequence[float]) -> list[float]:
    """Link rates (Gbit/s) at which the BF16 KV of `tokens` tokens takes `ratio` times `prefill_s` to cross."""
    bits = geometry.raw_bytes(tokens) * 8
    return [bits / (ratio * prefill_s) / 1e9 for ratio in ratios]


def stream_bytes(geometry: KVGeometry, variant: Variant, tokens: int) -> list[int]:
    """Bytes of each stream of `variant` for a `tokens`-token prompt (stock: the KV as stored)."""
    shape = KVShape(geometry.num_layers, tokens, geometry.kv_heads, geometry.head_dim, geometry.torch_dtype)
    return list(WireFormat.for_mode(variant.mode, variant.preset).stream_sizes(shape))


def run_speed(pd, link: ShapedLoopback, plan: ModelPlan, variant: Variant, tokenizer, rates: Sequence[float],
              prefill_s: float, reference_prefill_s: float, step: Callable[[], None]) -> list[dict]:  # fmt: skip
    """One row per link rate: medians of `plan.speed_repeats` streamed requests (ttft_sweep's summary).

    `prefill_s` is this deployment's calibration; the row's ``xfer/prefill``
    divides by `reference_prefill_s`, the one that set the rates, so that one
    link rate has one ratio in every variant.
    """
    args = argparse.Namespace(max_tokens=plan.speed_max_tokens, nth=",".join(map(str, plan.nth)))
    runs: dict[float, list[dict]] = {rate: [] for rate in rates}
    try:
        for repeat in range(plan.speed_repeats):
            for rate in rates:
                link.set_rate(rate, http_ports(pd))
                runs[rate].append(ttft_sweep.run_point(pd, tokenizer, plan.speed_tokens, "greedy", repeat, args))
                step()
    finally:
        link.set_rate(None)
    rows = []
    for rate in rates:
        row = ttft_sweep.summarize(variant.mode, rate, plan.speed_tokens, "greedy", prefill_s, runs[rate])
        tokens = row["prompt_tokens"]
        row.update(
            variant=variant.name,
            model=plan.model,
            stream_bytes=stream_bytes(plan.geometry, variant, tokens),
            bf16_transfer_to_prefill=plan.geometry.raw_bytes(tokens) * 8 / (rate * 1e9) / reference_prefill_s,
            reference_prefill_s=reference_prefill_s,
        )
        rows.append(row)
    return rows


def verdicts(rows: Sequence[dict]) -> list[dict]:
    """`ttft_sweep.verdicts` for `lynx` and for `lynx-2+6`, each against `int4` (t1) and `int8` (later tokens)."""
    out = []
    for name in ("lynx", "lynx-2+6"):
        chosen = [dict(r, mode="lynx" if r["variant"] == name else r["variant"]) for r in rows
                  if r["variant"] in (name, "int4", "int8")]  # fmt: skip
        for entry in ttft_sweep.verdicts(chosen):
            out.append({"variant": name, **entry})
    return out


def ratios_by_variant(rows: Sequence[dict], numerator: str, denominator: str, key: str = "t1_s") -> list[dict]:
    """Per link rate, ``numerator[key] / denominator[key]`` (e.g. int8's TTFT over lynx's)."""
    index = {(r["variant"], r["link_gbps"]): r for r in rows}
    out = []
    for (variant, rate), row in index.items():
        other = index.get((denominator, rate))
        if variant != numerator or other is None or not row.get(key) or not other.get(key):
            continue
        out.append({"link_gbps": rate, "ratio": row[key] / other[key],
                    "bf16_transfer_to_prefill": row["bf16_transfer_to_prefill"]})  # fmt: skip
    return sorted(out, key=lambda e: e["link_gbps"])


def units(tokens: int, chunk_tokens: int) -> int:
    """Pipeline units of a chunked prefill: chunks of `chunk_tokens` (a last chunk of a few tokens counts as none)."""
    return max(1, math.floor(tokens / chunk_tokens + 0.5))
