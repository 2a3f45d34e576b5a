"""One point's figures: bench_serving's own summary, plus what its per-request records add.

bench_serving's result line gives TTFT, TPOT, ITL and end-to-end percentiles
and goodput. The records (`capture.py`) add each request's Lynx timeline
(`meta_info["lynx"]`: when its anchor and residual landed, what it drafted,
what verify kept) and the link's achieved utilization.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

BENCH_KEYS = {
    "completed": "completed",
    "duration_s": "duration",
    "request_throughput": "request_throughput",
    "ttft_p50_ms": "median_ttft_ms",
    "ttft_p99_ms": "p99_ttft_ms",
    "tpot_p50_ms": "median_tpot_ms",
    "tpot_p99_ms": "p99_tpot_ms",
    "itl_p99_ms": "p99_itl_ms",
    "e2e_p50_ms": "median_e2e_latency_ms",
    "e2e_p99_ms": "p99_e2e_latency_ms",
    "goodput": "request_goodput",
    "slo_attainment": "slo_attainment",
}


def percentile(values: Sequence[float], q: float) -> float | None:
    """Linear-interpolated percentile (as numpy's default), None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    k = (len(ordered) - 1) * q / 100
    low = int(k)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (k - low)


def bench_summary(result: dict) -> dict:
    """The fields of bench_serving's result line that the report shows (None where absent)."""
    return {ours: result.get(theirs) for ours, theirs in BENCH_KEYS.items()}


def lynx_timeline(records: Sequence[dict]) -> dict:
    """Medians and totals of the decode server's per-request Lynx metrics."""
    metrics = [r["lynx"] for r in records if r.get("success") and r.get("lynx")]
    if not metrics:
        return {}

    def median(key: str) -> float | None:
        values = [m[key] for m in metrics if m.get(key) is not None]
        return statistics.median(values) if values else None

    late = [m["residual_ready_s"] - m["anchor_ready_s"] for m in metrics
            if m.get("residual_ready_s") is not None and m.get("anchor_ready_s") is not None]  # fmt: skip
    drafted = sum(m.get("speculative_tokens", 0) for m in metrics)
    accepted = sum(m.get("accepted_tokens", 0) for m in metrics)
    return {
        "anchor_ready_p50_s": median("anchor_ready_s"),
        "residual_after_anchor_p50_s": statistics.median(late) if late else None,
        "residual_after_anchor_max_s": max(late) if late else None,
        "drafted": drafted,
        "accepted": accepted,
        "acceptance": accepted / drafted if drafted else None,
        "rollbacks": sum(m.get("rollbacks", 0) for m in metrics),
        "verify_p50_s": median("verify_s"),
        "verify_batch_max": max((m.get("verify_batch", 0) for m in metrics), default=0),
    }


def achieved_utilization(records: Sequence[dict], bytes_per_request: float, duration_s: float, bytes_per_s: float) -> float | None:
    """Link time the completed requests' streams took over the run's duration."""
    done = sum(1 for r in records if r.get("success"))
    if not duration_s:
        return None
    return done * bytes_per_request / bytes_per_s / duration_s


def failures(records: Sequence[dict]) -> list[str]:
    """The error text of every failed request (shortened)."""
    return [r["error"][-300:] or "failed without an error text" for r in records if not r.get("success")]
