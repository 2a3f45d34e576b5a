"""A serving-load result as tables, verdicts and plots; `markdown` is the section docs/RESULTS.md carries."""

from __future__ import annotations

import statistics
from pathlib import Path

import doc_markdown as md

MODE_ORDER = ("bf16", "int8", "int4", "lynx", "auto", "stock", "stock-fp8")
COLUMNS = (("ttft_p50_ms", "TTFT p50 ms"), ("ttft_p99_ms", "TTFT p99 ms"), ("tpot_p99_ms", "TPOT p99 ms"),
           ("e2e_p50_ms", "E2E p50 ms"), ("e2e_p99_ms", "E2E p99 ms"), ("goodput", "goodput req/s"),
           ("utilization", "link busy"))  # fmt: skip


def _fmt(value, digits=0) -> str:
    if value is None:
        return "-"
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def _point_label(row: dict) -> str:
    load = "trace" if row["load"] is None else f"{row['load']:g}"
    return f"{row['topology']} {row['dataset']} {load}"


def ordered(rows: list[dict]) -> list[dict]:
    def key(r):
        base, _, variant = r["mode"].partition(":")
        return (r["topology"], r["dataset"], -1 if r["load"] is None else r["load"], MODE_ORDER.index(base), variant)

    return sorted(rows, key=key)


def table(result: dict) -> str:
    """Every point as one markdown row per mode."""
    head = "| point (int8 link load) | mode | req/s | " + " | ".join(t for _, t in COLUMNS) + " | failed |"
    lines = [head, "|" + "---|" * (len(COLUMNS) + 4)]
    for r in ordered(result["rows"]):
        digits = {"goodput": 3, "utilization": 2}
        cells = [_fmt(r.get(k), digits.get(k, 0)) for k, _ in COLUMNS]
        lines.append(f"| {_point_label(r)} | {r['mode']} | {_fmt(r['rate'], 3)} | " + " | ".join(cells)
                     + f" | {len(r['errors'])} |")  # fmt: skip
    return "\n".join(lines)


def ratio(a, b) -> float | None:
    return None if a is None or not b else a / b


def comparisons(result: dict) -> list[dict]:
    """Per point: lynx (and auto) against int8 and int4 (ratios < 1 favour the first)."""
    out = []
    for point, modes in _by_point(result).items():
        for mode in sorted(m for m in modes if m.split(":")[0] in ("lynx", "auto")):
            row, int8, int4 = modes[mode], modes.get("int8", {}), modes.get("int4", {})
            better = min((m for m in (int8, modes.get("lynx")) if m and m is not row), default=None,
                         key=lambda m: m.get("e2e_p50_ms") or float("inf"))  # fmt: skip
            out.append({
                "point": point, "mode": mode, "load": row["load"],
                "ttft_p50_vs_int8": ratio(row["ttft_p50_ms"], int8.get("ttft_p50_ms")),
                "ttft_p99_vs_int8": ratio(row["ttft_p99_ms"], int8.get("ttft_p99_ms")),
                "ttft_p50_vs_int4": ratio(row["ttft_p50_ms"], int4.get("ttft_p50_ms")),
                "e2e_p50_vs_int8": ratio(row["e2e_p50_ms"], int8.get("e2e_p50_ms")),
                "e2e_p99_vs_int8": ratio(row["e2e_p99_ms"], int8.get("e2e_p99_ms")),
                "goodput_vs_int8": ratio(row["goodput"], int8.get("goodput")),
                "e2e_p50_vs_better": ratio(row["e2e_p50_ms"], better.get("e2e_p50_ms")) if better else None,
                "within_own_slo": _within_own_slo(result, mode, row, int8),
            })  # fmt: skip
    return out


def _within_own_slo(result: dict, mode: str, row: dict, int8: dict) -> str | None:
    """``"16 vs 7 of 16"``: requests of `row` and of int8's row at the same point whose TTFT is within
    twice `mode`'s own idle TTFT (the goodput SLO above is twice int8's)."""
    idle = (result.get("idle") or {}).get(mode)
    if idle is None or not int8 or not row.get("records") or not int8.get("records"):
        return None
    slo_s = 2 * idle["ttft_s"]
    met = [sum(1 for r in rows if r.get("ok") and r["ttft_s"] <= slo_s) for rows in (row["records"], int8["records"])]
    return f"{met[0]} vs {met[1]} of {len(row['records'])}"


def comparison_table(result: dict) -> str:
    keys = ("ttft_p50_vs_int8", "ttft_p99_vs_int8", "ttft_p50_vs_int4", "e2e_p50_vs_int8", "e2e_p99_vs_int8",
            "goodput_vs_int8")  # fmt: skip
    names = ["point", "mode", *(k.replace("_vs_", " / ") for k in keys), "TTFT within twice the mode's idle TTFT, vs int8"]
    rows = [[c["point"], c["mode"], *(_fmt(c[k], 2) for k in keys), c["within_own_slo"] or "-"] for c in comparisons(result)]
    return "\n".join(md.table(names, rows))


def _by_point(result: dict) -> dict[str, dict[str, dict]]:
    by_point: dict[str, dict[str, dict]] = {}
    for r in result["rows"]:
        by_point.setdefault(r["key"].rsplit("/", 1)[0], {})[r["mode"]] = r
    return by_point


def timelines(result: dict) -> list[dict]:
    """Per point and lynx-like mode, each request against int8's answer to the same request (same
    arrival): its E2E over int8's, split by whether a verify rolled its drafts back, and when its
    residual landed against int8's whole stream (both timed by the decode server from the request)."""
    out = []
    for point, modes in _by_point(result).items():
        int8 = modes.get("int8")
        for mode in sorted(m for m in modes if m.split(":")[0] in ("lynx", "auto")):
            if int8 is None:
                continue
            pairs = _same_arrivals(modes[mode]["records"], int8["records"])
            if not pairs:
                continue
            kept = [c["e2e_s"] / r["e2e_s"] for c, r in pairs if not c.get("rollbacks")]
            back = [c["e2e_s"] / r["e2e_s"] for c, r in pairs if c.get("rollbacks")]
            late = [c["residual_ready_s"] - r["anchor_ready_s"] for c, r in pairs
                    if c.get("residual_ready_s") is not None and r.get("anchor_ready_s") is not None]  # fmt: skip
            out.append({
                "point": point, "mode": mode, "requests": len(pairs), "rolled_back": len(back),
                "e2e_vs_int8_kept": statistics.median(kept) if kept else None,
                "e2e_vs_int8_rolled_back": statistics.median(back) if back else None,
                "residual_after_int8_s": statistics.median(late) if late else None,
                "drafted": statistics.median(c.get("speculative_tokens") or 0 for c, _ in pairs),
            })  # fmt: skip
    return out


def _same_arrivals(records: list[dict], references: list[dict], within_s: float = 0.05) -> list[tuple[dict, dict]]:
    """Each answered record with the answered reference that arrived at the same time (every mode
    replays the same arrivals; the records' order is the order they were sent in, which can differ)."""
    answered = [r for r in references if r.get("ok")]
    pairs = []
    for record in (r for r in records if r.get("ok")):
        near = min(answered, key=lambda r: abs(r["arrival_s"] - record["arrival_s"]), default=None)
        if near is not None and abs(near["arrival_s"] - record["arrival_s"]) < within_s:
            pairs.append((record, near))
    return pairs


def timeline_table(result: dict) -> str:
    names = ["point", "mode", "requests rolled back", "E2E / int8, drafts kept", "E2E / int8, rolled back",
             "residual landed after int8's stream, s", "drafted tokens"]  # fmt: skip
    rows = [[t["point"], t["mode"], f"{t['rolled_back']} of {t['requests']}", _fmt(t["e2e_vs_int8_kept"], 2),
             _fmt(t["e2e_vs_int8_rolled_back"], 2), _fmt(t["residual_after_int8_s"], 2), _fmt(float(t["drafted"]), 0)]
            for t in timelines(result)]  # fmt: skip
    return "\n".join(md.table(names, rows))


def exactness_line(result: dict) -> str:
    total = result["exactness"]["total"]
    wrong = [p for p in total.get("partings", []) if p["kind"] == "mismatch"]
    own = sum(1 for p in wrong if p.get("fresh_int8", {}).get("picks_candidates_token"))
    partings = "; ".join(f"{p['point']} request {p['request']} position {p['position']}: "
                         + (f"gap {p['gap']:.4f}" if p["gap"] is not None else p["detail"])
                         + (f", a fresh int8 decoder picks lynx's token there (gap {p['fresh_int8']['gap']:.4f})"
                            if p.get("fresh_int8", {}).get("picks_candidates_token") else "")
                         for p in wrong)  # fmt: skip
    return (f"{total['answers']} answers judged ({total['tokens_judged']} tokens): {total['equal']} equal to int8's, "
            f"{total['equal_after_near_ties']} equal after {total['near_ties']} near ties (each judged onward against "
            f"a reference continued from the candidate's prefix, {total['reference_continuations']} continuations), "
            f"{total['wrong']} wrong, {total['without_reference']} without an int8 answer, "
            f"{total['failed_requests']} failed requests."
            + (f" Wrong partings ({own} of {len(wrong)} where int8 decoding itself takes lynx's token): {partings}."
               if wrong else ""))  # fmt: skip


def idle_link_bound_line(result: dict) -> str | None:
    """The idle-only pairs on the slower link: each mode's first token alone, int8's over lynx's, and
    lynx's against its anchor's bytes at the link rate (`int4`'s stream: the same bytes) plus one of
    int8's idle decode steps."""
    bound = result.get("idle_link_bound")
    if not bound or not bound["idle"]:
        return None
    idle, link = bound["idle"], bound["link"]
    times = ", ".join(f"`{mode}` {values['ttft_s']:.2f} s" for mode, values in idle.items())
    text = (f"Alone on an idle pair, {bound['input_tokens']}-token prompts on a slower link ({link['gbps']:.4f} "
            f"Gbit/s, BF16 transfer {link['bf16_over_prefill']:.2f}x their prefill of {link['prefill_s']:.2f} s), "
            f"medians of 3 requests: TTFT {times}")  # fmt: skip
    if {"int8", "lynx"} <= set(idle):
        anchor_s = link["stream_bytes"]["int4"] * 8 / (link["gbps"] * 1e9)
        step_s = (idle["int8"]["e2e_s"] - idle["int8"]["ttft_s"]) / (result["profile"]["output_tokens"] - 1)
        text += (f"; `int8` / `lynx` {idle['int8']['ttft_s'] / idle['lynx']['ttft_s']:.2f}; `lynx`'s first token "
                 f"{idle['lynx']['ttft_s'] / (anchor_s + step_s):.2f}x its anchor's bytes at the link rate "
                 f"({anchor_s:.2f} s) plus one of `int8`'s idle decode steps ({step_s:.2f} s)")  # fmt: skip
    return text + "."


def markdown(result: dict) -> str:
    link = result["link"]
    return "\n\n".join([
        f"Link {link['gbps']:.4f} Gbit/s, paced by Lynx's sender (kernel-shaped for SGLang's stock backend and "
        f"the fan-in point); one prompt's prefill {link['prefill_s']:.2f} s, its BF16 transfer "
        f"{link['bf16_over_prefill']:.2f}x that; {result['profile']['requests']} requests per point "
        f"({result['profile'].get('light_requests', result['profile']['requests'])} below half of int8's link), "
        f"{result['profile']['input_tokens']} prompt and {result['profile']['output_tokens']} output tokens; "
        f"goodput counts requests with TTFT <= {result['ttft_slo_ms']:.0f} ms (twice int8's idle TTFT); "
        f"run took {result.get('wall_s', 0) / 60:.0f} min.",
        table(result),
        comparison_table(result),
        "Per request, against `int8`'s answer to the same request (medians):",
        timeline_table(result),
        exactness_line(result),
        *([line] if (line := idle_link_bound_line(result)) else []),
        *(["Deployments that did not serve: " + "; ".join(f"{k}: {v.splitlines()[0][:300]}" for k, v in result["failed"].items())]
          if result.get("failed") else []),
    ])  # fmt: skip


def publish(result: dict, out: Path) -> None:
    """Print the tables and write the plots under `out`."""
    print(markdown(result))
    try:
        plot(result, out)
    except ImportError:
        print("(matplotlib missing: no plots)")


def plot(result: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in result["rows"] if r["dataset"] == "random-ids" and r["topology"] == "1p1d"]
    metrics = (("ttft_p50_ms", "TTFT p50 (ms)"), ("ttft_p99_ms", "TTFT p99 (ms)"), ("e2e_p50_ms", "E2E p50 (ms)"),
               ("goodput", "goodput (req/s)"))  # fmt: skip
    fig, axes = plt.subplots(1, len(metrics), figsize=(4.2 * len(metrics), 3.6))
    for ax, (key, label) in zip(axes, metrics):
        for mode in sorted({r["mode"] for r in rows}, key=lambda m: (MODE_ORDER.index(m.split(":")[0]), m)):
            pts = sorted((r["load"], r[key]) for r in rows if r["mode"] == mode and r.get(key) is not None)
            if pts:
                ax.plot(*zip(*pts), marker="o", label=mode)
        ax.set_xlabel("offered load on int8's link")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    out.mkdir(parents=True, exist_ok=True)
    fig.savefig(out / "serving_load.png", dpi=110)
    plt.close(fig)
