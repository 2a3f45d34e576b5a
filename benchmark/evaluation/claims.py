"""The paper's four headline claims, each set beside what this run measured (and what it cannot measure)."""

from __future__ import annotations

from collections.abc import Iterable

# A first token within this factor of int4's counts as "comparable" (ttft_sweep's verdict rule).
COMPARABLE = 1.05


def claims(results: dict) -> list[dict]:
    models = results["models"]
    return [_vs_int4(models), _matches_bf16(models), _vs_int8(models, results.get("cluster", {})), _cachegen(models)]


def _ratios(rows: Iterable[dict], numerator: str, denominator: str) -> list[tuple[float, float]]:
    """(xfer/prefill, numerator t1 / denominator t1) per link rate."""
    rows = list(rows)
    index = {(r["variant"], r["link_gbps"]): r for r in rows}
    out = []
    for (variant, rate), row in index.items():
        other = index.get((denominator, rate))
        if variant == numerator and other and row.get("t1_s") and other.get("t1_s"):
            out.append((row["bf16_transfer_to_prefill"], row["t1_s"] / other["t1_s"]))
    return sorted(out, reverse=True)


def _fmt_pairs(pairs: list[tuple[float, float]]) -> str:
    return ", ".join(f"{ratio:.2f} at xfer/prefill {x:.1f}" for x, ratio in pairs) or "not measured"


def _vs_int4(models: dict) -> dict:
    parts, all_ratios = [], []
    for model, data in models.items():
        pairs = _ratios(data.get("speed", []), "lynx", "int4")
        all_ratios += [r for _, r in pairs]
        parts.append(f"{model}: lynx TTFT / int4 TTFT {_fmt_pairs(pairs)}")
    met = sum(r <= COMPARABLE for r in all_ratios)
    status = f"{met} of {len(all_ratios)} rows within {COMPARABLE:g}x of int4" if all_ratios else "not measured"
    return {"claim": "TTFT comparable to 4-bit KV quantization", "measured": "; ".join(parts), "status": status}


def _matches_bf16(models: dict) -> dict:
    parts, exact, total = [], 0, 0
    for model, data in models.items():
        variants = data["variants"]
        score = {n: v["summary"]["mean_score"] for n, v in variants.items() if "summary" in v}
        lynx = next((c for c in data.get("comparisons", []) if (c["reference"], c["candidate"]) == ("int8", "lynx")), None)
        text = f"{model}: mean score lynx {_s(score.get('lynx'))}, int8 {_s(score.get('int8'))}, bf16 {_s(score.get('bf16'))}"
        if lynx:
            n = lynx["counts"]
            exact += n["equal"] + n["near_tie"]
            total += sum(n.values())
            text += f"; lynx = int8 on {n['equal']} items, near-tie on {n['near_tie']}, differs on {n['mismatch']}"
        summary = data.get("likelihood", {}).get("summary", {}).get("int8")
        if summary:
            kl = summary["kl"]
            text += f"; int8 KL vs bf16 {kl['mean']:.1e} nats/token [{kl['low']:.1e}, {kl['high']:.1e}]"
        parts.append(text)
    status = (f"lynx equals int8 on {exact} of {total} items; int8 (the full-precision reference Lynx "
              "verifies against) is lossy but close to bf16") if total else "not measured"  # fmt: skip
    return {"claim": "accuracy matching BF16", "measured": "; ".join(parts), "status": status}


def _s(value) -> str:
    return "—" if value is None else f"{value:.2f}"


def _vs_int8(models: dict, cluster: dict) -> dict:
    parts, best = [], []
    for model, data in models.items():
        pairs = _ratios(data.get("speed", []), "int8", "lynx")
        best += [r for _, r in pairs]
        parts.append(f"{model}: int8 TTFT / lynx TTFT {_fmt_pairs(pairs)}")
    estimated = [r["int8_over_lynx"] for r in cluster.get("ratios", [])]
    if estimated:
        parts.append(f"estimate at cluster scale: {min(estimated):.2f}-{max(estimated):.2f}x")
    status = f"best measured {max(best):.2f}x (paper: up to 1.43x)" if best else "not measured"
    return {"claim": "TTFT up to 1.43x better than 8-bit KV quantization", "measured": "; ".join(parts), "status": status}


def _cachegen(models: dict) -> dict:
    parts = []
    for model, data in models.items():
        score = {n: v["summary"]["mean_score"] for n, v in data["variants"].items() if "summary" in v}
        if "lynx" in score and "int4" in score:
            parts.append(f"{model}: lynx {score['lynx']:.2f} vs lossy int4 {score['int4']:.2f}")
    return {
        "claim": "accuracy up to 5.1% better than CacheGen",
        "measured": "no CacheGen implementation here; the nearest lossy baseline is int4 (same anchor bytes): "
        + ("; ".join(parts) or "not measured"),
        "status": "not comparable",
    }
