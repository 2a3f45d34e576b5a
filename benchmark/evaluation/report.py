"""The evaluation's markdown report, built from its results JSON (every figure there, the main ones here)."""

from __future__ import annotations

from dataclasses import asdict

import doc_markdown as md
from evaluation.claims import claims
from evaluation.plan import ModelPlan

_SPEED_KEYS = ("t1_s", "t8_s", "t32_s")


def plan_summary(plan: ModelPlan) -> dict:
    data = asdict(plan)
    data["geometry"] = asdict(plan.geometry)
    return data


def _f(value, spec=".2f") -> str:
    return "—" if value is None else format(value, spec)


def render(results: dict, figures: dict[str, str]) -> str:
    lines = [
        "# Lynx evaluation report",
        "",
        f"Profile `{results['profile']}`, started {results['started']}, wall time "
        f"{results['wall_s'] / 60:.1f} min; {results['machine']['cpus']} CPUs, {results['machine']['platform']}; "
        f"load average at start {_load(results['machine']['load_at_start'])}, at end "
        f"{_load(results['machine']['load_at_end'])}. Variants: {', '.join(results['variants'])}.",
        *([f"Report rebuilt {results['rebuilt']} from the run's measurements (`--from-json`), "
           "with that checkout's estimator."] if "rebuilt" in results else []),
        "",
        "Link: `tc` shaping of the loopback device in a private network namespace (HTTP ports exempt); "
        "rates are chosen per model so that the BF16 KV's transfer takes 2.0, 0.7 and 0.2 times the "
        "prefill (`xfer/prefill`). Every figure below is a measurement on this CPU except the sections "
        "labelled **estimate**.",
        "",
        "## Claims side by side",
        "",
        *md.table(["claim (paper)", "measured here", "status"], [[c["claim"], c["measured"], c["status"]] for c in claims(results)]),
        "",
    ]
    for model, data in results["models"].items():
        lines += _model_section(model, data, figures)
    lines += _cluster_section(results["cluster"], figures)
    return "\n".join(lines) + "\n"


def _load(values) -> str:
    return "/".join(f"{v:.1f}" for v in values)


def _model_section(model: str, data: dict, figures: dict[str, str]) -> list[str]:
    lines = [f"## {model}", ""]
    failures = [(n, v["error"]) for n, v in data["variants"].items() if "error" in v]
    for name, error in failures:
        lines += [f"**{name} failed:** `{error.splitlines()[0]}`", ""]
    lines += ["### Accuracy on long-context tasks (real PD pair, through the router)", ""]
    lines += _accuracy_table(data)
    lines += ["", *_comparison_lines(data), ""]
    lines += _item_table(data)
    if f"accuracy_{model}" in figures:
        lines += ["", f"![accuracy]({figures[f'accuracy_{model}']})"]
    lines += ["", "### Teacher-forced log-likelihood and KL divergence against bf16 (held-out Shakespeare)", ""]
    lines += _likelihood_table(data.get("likelihood", {}))
    lines += ["", "### Speed", ""]
    lines += _speed_table(data)
    if f"ttft_{model}" in figures:
        lines += ["", f"![ttft]({figures[f'ttft_{model}']})"]
    lines += ["", "### Estimator against the measured rows", ""]
    lines += _estimator_table(data)
    lines += ["", "### Where the time went", ""]
    lines += _timing_table(data)
    return lines + [""]


def _accuracy_table(data: dict) -> list[str]:
    tasks = sorted({t for v in data["variants"].values() for t in v.get("summary", {}).get("by_task", {})})
    rows = []
    for name, v in data["variants"].items():
        s = v.get("summary")
        if not s:
            continue
        cells = [_f(s["by_task"][t]["mean_score"]) if t in s["by_task"] else "—" for t in tasks]
        spec = f"{s['accepted_tokens']} / {s['speculative_tokens']}" if s["speculative_tokens"] else "—"
        rows.append([name, str(s["items"]), *cells, _f(s["mean_score"]), spec, str(s["rollbacks"]) if s["speculative_tokens"] else "—"])
    return md.table(["variant", "items", *tasks, "mean", "accepted / drafted", "rollbacks"], rows)


def _comparison_lines(data: dict) -> list[str]:
    out = ["Item for item (greedy output tokens; a parting counts only at a reference near-tie, gap < 0.02, and in "
           "an exact pair the tokens after it are judged against the reference continued from the candidate's "
           "prefix):", ""]  # fmt: skip
    for c in data.get("comparisons", []):
        n = c["counts"]
        gaps = [p["gap"] for e in c["items"] for p in e.get("partings", []) if p["kind"] == "near_tie"]
        ties = f", tie gaps {', '.join(f'{g:.4f}' for g in gaps)}" if gaps else ""
        unchecked = f", {c['tokens_unchecked']} tokens after a first tie not judged (lossy pair)" if c.get(
            "tokens_unchecked") else ""  # fmt: skip
        out.append(f"* `{c['candidate']}` against `{c['reference']}`: {n['equal']} equal, {n['near_tie']} equal after "
                   f"near ties, {n['mismatch']} differ (of {sum(n.values())}){ties}{unchecked}")  # fmt: skip
    return out


def _item_table(data: dict) -> list[str]:
    names = [n for n, v in data["variants"].items() if v.get("items")]
    scores: dict[str, dict[str, float]] = {}
    for name in names:
        for r in data["variants"][name]["items"]:
            scores.setdefault(r["item"], {})[name] = r["score"]
    rows = [[item, *(_f(by.get(n)) for n in names)] for item, by in scores.items()]
    return md.table(["item", *names], rows)


def _likelihood_table(lik: dict) -> list[str]:
    if "summary" not in lik:
        return [f"not measured: {lik.get('error', 'no windows')}"]
    rows = []
    for codec, s in lik["summary"].items():
        kl, dn, top = s["kl"], s["delta_nll"], s["top1_agree"]
        rows.append([codec, f"{kl['mean']:.2e} [{kl['low']:.2e}, {kl['high']:.2e}]",
                     f"{dn['mean']:+.4f} [{dn['low']:+.4f}, {dn['high']:+.4f}]",
                     f"{top['mean']:.3f} [{top['low']:.3f}, {top['high']:.3f}]", str(kl["n"])])  # fmt: skip
    nll = next(iter(lik["summary"].values()))["nll_ref"]
    return [*md.table(["context KV", "KL(bf16 ‖ variant), nats/token [95% CI]", "Δ NLL, nats/token [95% CI]",
                     "top-1 agreement [95% CI]", "windows"], rows), "",
            f"bf16 reference: {nll:.3f} nats/token. `int8` is what `lynx` decodes after verification, `int4` its "
            "anchor, `2+6` what `lynx-2+6` decodes after verification, `2-bit` its anchor (no mode serves it alone)."]  # fmt: skip


def _speed_table(data: dict) -> list[str]:
    rows = []
    base = {(r["link_gbps"]): r["t1_s"] for r in data["speed"] if r["variant"] == "bf16"}
    for r in sorted(data["speed"], key=lambda r: (-r["bf16_transfer_to_prefill"], r["variant"])):
        spec = f"{r['accepted_tokens']} / {r['speculative_tokens']}" if "speculative_tokens" in r else "—"
        vs = r["t1_s"] / base[r["link_gbps"]] if base.get(r["link_gbps"]) and r.get("t1_s") else None
        rows.append([r["variant"], f"{r['link_gbps']:.4f}", str(r["prompt_tokens"]), _f(r["bf16_transfer_to_prefill"]),
                     _f(r["prefill_s"]), _f(r.get("t1_s")), _f(vs), _f(r.get("anchor_ready_s")),
                     _f(r.get("residual_ready_s")), spec, str(r.get("rollbacks", "—")),
                     *(_f(r.get(k)) for k in _SPEED_KEYS[1:])])  # fmt: skip
    header = ["variant", "Gbit/s", "prompt tokens", "xfer/prefill", "prefill s", "TTFT s", "vs bf16",
              "anchor landed s", "residual landed s", "accepted / drafted", "rollbacks", "t8 s", "t32 s"]  # fmt: skip
    return [*md.table(header, rows), "", f"Medians of {_repeats(data)} requests per row; times in seconds from the "
            "client's request; `anchor landed` is when all of the KV had landed in one-stream variants."]  # fmt: skip


def _repeats(data: dict) -> str:
    return str(data["speed"][0]["repeats"]) if data["speed"] else "—"


def _estimator_table(data: dict) -> list[str]:
    check = data.get("estimator_check")
    if not check:
        return ["not run"]
    rows = [[c["variant"], f"{c['link_gbps']:.4f}", _f(c["bf16_transfer_to_prefill"]), _f(c["estimated_ttft_s"]),
             _f(c["measured_ttft_s"]), _f(c.get("estimate_over_measured"))] for c in check]  # fmt: skip
    codec = ", ".join(f"{n} {r['encode_gbps'] * 1e3:.0f}/{r['decode_gbps'] * 1e3:.0f}"
                      for n, r in data["codec_rates"].items())  # fmt: skip
    return [*md.table(["variant", "Gbit/s", "xfer/prefill", "estimated TTFT s", "measured TTFT s", "estimate / measured"], rows),
            "", f"Inputs: prefill {data['estimator_prefill_s']:.2f} s (bf16 calibration), codec encode/decode "
            f"MB/s on this model's KV: {codec}; pipeline units: each layer of each 512-token prefill chunk (Lynx "
            "streams layer by layer on this platform), each chunk for `stock`."]  # fmt: skip


def _early(part) -> str:
    """What started early: ``pair``, ``prefill`` or nothing (older runs recorded True for a pair)."""
    if part is True:
        return "pair"
    return {"pair": "pair", "prefill": "prefill server"}.get(part or "", "no")


def _timing_table(data: dict) -> list[str]:
    rows = []
    for name, v in data["variants"].items():
        t = v.get("timings")
        if t:
            rows.append([name, _early(t.get("early_start")), _f(t.get("start_wait_s"), ".0f"),
                         _f(t.get("speed_s"), ".0f"), _f(t.get("items_s"), ".0f")])  # fmt: skip
    wait = data.get("scoring_wait_s")
    return [*md.table(["variant", "started early", "waited for its start s", "speed rows s", "task items s"], rows), "",
            "An early start (of the pair, or of its prefill server only where two pairs do not fit in memory) "
            "runs while the previous variant answers its task items (never during speed rows). "
            f"Left to wait for the held-out scoring at the end: {_f(wait, '.0f')} s."]  # fmt: skip


def _cluster_section(cluster: dict, figures: dict[str, str]) -> list[str]:
    lines = ["## Cluster scale (**estimate**, not a measurement)", ""]
    for model, (tflops, what) in cluster["assumptions"].items():
        lines.append(f"* {model}: prefill compute-bound at {tflops:g} TFLOP/s effective ({what}); 8,192-token "
                     "prefill chunks; codec time not counted.")  # fmt: skip
    lines += ["", *md.table(["model", "tokens", "Gbit/s", "bf16 xfer/prefill", "bf16 s", "int8 s", "int4 s", "lynx s",
                           "lynx-2+6 s", "int8 / lynx"], _cluster_rows(cluster))]  # fmt: skip
    if "estimate" in figures:
        lines += ["", f"![estimate]({figures['estimate']})"]
    return lines


def _cluster_rows(cluster: dict) -> list[list[str]]:
    index = {(r["model"], r["tokens"], r["link_gbps"], r["mode"]): r for r in cluster["table"]}
    rows = []
    for (model, tokens, gbps, mode), r in index.items():
        if mode != "bf16":
            continue
        get = {m: index[(model, tokens, gbps, m)]["ttft_s"] for m in ("bf16", "int8", "int4", "lynx", "lynx-2+6")}
        rows.append([model, str(tokens), f"{gbps:g}", _f(r["bf16_transfer_to_prefill"]), *(_f(get[m], ".3f") for m in get),
                     _f(get["int8"] / get["lynx"])])  # fmt: skip
    return rows


def console_summary(results: dict) -> str:
    lines = ["claims:"]
    lines += [f"  {c['claim']}: {c['measured']} [{c['status']}]" for c in claims(results)]
    for model, data in results["models"].items():
        for c in data.get("comparisons", []):
            n = c["counts"]
            lines.append(f"{model}: {c['candidate']} vs {c['reference']}: {n['equal']} equal, {n['near_tie']} equal after "
                         f"near ties, {n['mismatch']} differ")  # fmt: skip
        for name, v in data["variants"].items():
            if "summary" in v:
                lines.append(f"{model}: {name} mean score {_f(v['summary']['mean_score'])} over {v['summary']['items']} items")
            if "error" in v:
                lines.append(f"{model}: {name} FAILED {v['error'].splitlines()[0]}")
    return "\n".join(lines)
