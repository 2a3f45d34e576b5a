"""A soak's verdict: rounds of load with client aborts, and whether memory and slots stay flat.

Each round is one bench_serving load (alternately `random-ids` and
`generated-shared-prefix` prompts, a new seed each round) with the `abort`
fault and one request of each other kind (`mixed.py`: penalties, logit bias,
stop strings, grammars) beside it; after each, the deployment's idle levels
are read. The
slope of resident memory over the rounds (least squares, MiB per hour) says
whether the servers grow; slots, rows and rooms held must be 0 after every round.
"""

from __future__ import annotations

from collections.abc import Sequence

DATASETS = ("random-ids", "generated-shared-prefix")


def slope_per_hour(points: Sequence[tuple[float, float]]) -> float | None:
    """Least-squares slope of ``(seconds, value)`` points, per hour; None for fewer than two times."""
    if len({t for t, _ in points}) < 2:
        return None
    n = len(points)
    mean_t = sum(t for t, _ in points) / n
    mean_v = sum(v for _, v in points) / n
    covariance = sum((t - mean_t) * (v - mean_v) for t, v in points)
    variance = sum((t - mean_t) ** 2 for t, _ in points)
    return round(covariance / variance * 3600, 2)


def summary(rounds: Sequence[dict]) -> dict:
    """Totals over the rounds and the memory slope (the first round warms the servers up and is left
    out of the slope, as the fault matrix's first idle point is its baseline)."""
    steady = rounds[1:] if len(rounds) > 2 else rounds
    totals = {k: sum(r[k] for r in rounds) for k in ("requests", "answered", "failed", "wrong", "hung", "slots_held",
                                                    "rows_held", "rooms_held")}  # fmt: skip
    return {
        "rounds": len(rounds),
        "minutes": round(rounds[-1]["at_s"] / 60, 1) if rounds else 0.0,
        **totals,
        "aborted": sum(len(r["note"].get("aborted", [])) for r in rounds),
        "other_kinds": {k: sum(r["beside"][k] for r in rounds if "beside" in r)
                        for k in ("requests", "answered", "drafted", "failed", "wrong", "tokens_judged", "near_ties")},
        "rss_mib_first": rounds[0]["rss_mib"] if rounds else None,
        "rss_mib_last": rounds[-1]["rss_mib"] if rounds else None,
        "rss_slope_mib_per_hour": slope_per_hour([(r["at_s"], r["rss_mib"]) for r in steady]),
        "passed": bool(rounds) and all(r["passed"] for r in rounds),
    }
