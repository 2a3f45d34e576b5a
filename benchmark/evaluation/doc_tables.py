"""docs/RESULTS.md's tables, each rendered from the evaluation's compact JSON (`compact.py`).

`scripts/doc_tables.py` calls one of these on the parsed
`docs/results/evaluation.json` for each generated block:

* `run_line`: the run's profile, date, wall time and machine;
* `claims_markdown`: the paper's four claims beside what the run measured;
* `accuracy_markdown`: mean task score per model, task and variant;
* `likelihood_markdown`: KL and top-1 agreement against bf16 per context KV and model;
* `speed_markdown`: TTFT per model, link rate and variant, lynx's later tokens against int8's;
* `timings_markdown`: each variant's start, speed rows and task items, in seconds.

The claims are worded as in RESULTS.md (`claims.claims`, report.md's table, says the
same at more length). Nothing heavy is imported (no torch, no plan): the docs check
runs in the default test tier.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Sequence

import doc_markdown as md
from evaluation.claims import COMPARABLE

PAPER_SPEEDUP = 1.43  # the paper's best TTFT gain over 8-bit KV quantization
TASK_NAMES = {"multikey": "multi-key needle", "variable-tracking": "variable tracking"}
# Tasks whose items hide something at a depth of the context (variable tracking has none).
DEPTH_TASKS = frozenset({"multikey", "needle", "passkey"})
CODEC_ROLES = {
    "int8": "what `lynx` decodes after verification",
    "int4": "the `lynx` anchor",
    "2+6": "`lynx-2+6` after verification",
    "2-bit": "its anchor",
}
# What started early (`runner.EarlyStart.part`; older runs recorded True for a pair).
EARLY = {"pair": "pair", "prefill": "prefill server", True: "pair"}


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    return "\n".join(md.table(header, rows))


def _f(value, spec: str = ".2f") -> str:
    return "—" if value is None else format(value, spec)


def _e(value: float, digits: int = 2) -> str:
    """Scientific notation as the docs write it: ``1.35e-5``."""
    mantissa, exponent = format(value, f".{digits}e").split("e")
    return f"{mantissa}e{int(exponent)}"


def _and(parts: Sequence[str]) -> str:
    return " and ".join([", ".join(parts[:-1]), parts[-1]]) if len(parts) > 1 else "".join(parts)


def _label(doc: dict, model: str) -> str:
    return doc["plans"].get(model, {}).get("label", model)


def _rates(rows: Sequence[dict]) -> list[dict[str, dict]]:
    """One model's speed rows grouped by link rate (variant -> row), the largest xfer/prefill first."""
    groups: dict[float, dict[str, dict]] = {}
    for row in rows:
        groups.setdefault(row["link_gbps"], {})[row["variant"]] = row
    return sorted(groups.values(), key=lambda g: -next(iter(g.values()))["bf16_transfer_to_prefill"])


def _ratio(group: dict[str, dict], numerator: str, denominator: str, key: str = "t1_s") -> float | None:
    top, bottom = group.get(numerator, {}).get(key), group.get(denominator, {}).get(key)
    return top / bottom if top and bottom else None


def _per_model_ratios(doc: dict, numerator: str, denominator: str) -> dict[str, list[float]]:
    """Model -> `numerator` TTFT over `denominator` TTFT at each link rate, largest xfer/prefill first."""
    out = {}
    for model, data in doc["models"].items():
        ratios = [_ratio(g, numerator, denominator) for g in _rates(data.get("speed", []))]
        if any(r is not None for r in ratios):
            out[model] = [r for r in ratios if r is not None]
    return out


def _scores(data: dict) -> dict[str, float]:
    return {n: v["summary"]["mean_score"] for n, v in data["variants"].items() if v.get("summary")}


def run_line(doc: dict) -> str:
    """Profile, start, wall time (and each model's part of it), machine."""
    started = datetime.datetime.fromisoformat(doc["started"]).astimezone(datetime.timezone.utc)
    parts = [f"{_label(doc, m)} {_model_seconds(d) / 60:.1f}" for m, d in doc["models"].items()]
    return (f"Profile `{doc['profile']}`, started {started:%Y-%m-%d %H:%M} UTC, wall time {doc['wall_s'] / 60:.1f} min "
            f"({_and(parts)} min in their variants' starts, speed rows and task items); {doc['machine']['cpus']} CPUs, "
            f"{doc['machine']['platform']}.")  # fmt: skip


def _model_seconds(data: dict) -> float:
    keys = ("start_wait_s", "speed_s", "items_s")
    return sum(v.get("timings", {}).get(k) or 0.0 for v in data["variants"].values() for k in keys)


def claims_markdown(doc: dict) -> str:
    """| claim (paper) | measured here | verdict |, one row per claim."""
    rows = [_comparable_to_int4(doc), _matches_bf16(doc), _faster_than_int8(doc), _against_cachegen(doc)]
    return _table(["claim (paper)", "measured here", "verdict"], rows)


def _ratio_text(doc: dict, ratios: dict[str, list[float]], joiner: str) -> str:
    return joiner.join(f"{_label(doc, m)} {', '.join(f'{r:.2f}' for r in values)}" for m, values in ratios.items())


def _targets(doc: dict) -> list[str]:
    """The planned BF16 transfer / prefill of the link rates, largest first."""
    ratios = {r for p in doc["plans"].values() for r in p.get("speed_ratios", ())}
    return [f"{r:g}" for r in sorted(ratios, reverse=True)]


def _comparable_to_int4(doc: dict) -> list[str]:
    claim = "TTFT comparable to 4-bit KV quantization"
    ratios = _per_model_ratios(doc, "lynx", "int4")
    if not ratios:
        return [claim, "not measured", "not measured"]
    measured = (f"`lynx` TTFT / `int4` TTFT: {_ratio_text(doc, ratios, ' and ')} at BF16 transfer / prefill of "
                f"about {_and(_targets(doc))}")  # fmt: skip
    values = [r for v in ratios.values() for r in v]
    over = [f"{r:.2f}" for r in values if r > COMPARABLE]
    verdict = f"within {COMPARABLE:g}x in {len(values) - len(over)} of {len(values)} rows"
    return [claim, measured, verdict + (f"; the other{'s' if len(over) > 1 else ''} {', '.join(over)}" if over else "")]


def _matches_bf16(doc: dict) -> list[str]:
    claim, parts = "accuracy matching BF16", []
    same, per_model, near_ties = 0, [], 0
    for model, data in doc["models"].items():
        pair = next((c for c in data.get("comparisons", []) if (c["reference"], c["candidate"]) == ("int8", "lynx")), None)
        if pair:
            n = pair["counts"]
            same += n["equal"] + n["near_tie"]
            near_ties += n["near_tie"]
            per_model.append((model, n["equal"] + n["near_tie"], sum(n.values())))
    total = sum(t for *_, t in per_model)
    if per_model:
        detail = ", ".join(f"{_label(doc, m)} {s} of {t}" for m, s, t in per_model)
        ties = f", {near_ties} of them after near ties" if near_ties else ""
        parts.append(f"`lynx` equals `int8` token for token on {same} of {total} task items ({detail}){ties}")
    kl = {m: d.get("likelihood", {}).get("summary", {}).get("int8") for m, d in doc["models"].items()}
    kl = {m: s for m, s in kl.items() if s and s["kl"]["mean"] is not None}
    if kl:
        divergences = _and([f"{_e(s['kl']['mean'], 1)} ({_label(doc, m)})" for m, s in kl.items()])
        agreements = _and([f"{s['top1_agree']['mean']:.3f}" for s in kl.values()])
        parts.append(f"`int8` vs `bf16`: KL {divergences} nats/token, top-1 agreement {agreements}")
    equal, judged = _equal_scores(doc, "bf16", "lynx")
    if judged:
        parts.append(f"`lynx`'s task scores equal `bf16`'s on {'every item' if equal == judged else f'{equal} of {judged} items'}")
    if not per_model:
        verdict = "not measured"
    elif same == total:
        verdict = "holds for what Lynx promises (full-precision `int8` decoding)"
        if any(s["kl"]["mean"] > 0 for s in kl.values()):
            verdict += "; `int8` itself is 8-bit, not bit-equal to BF16"
    else:
        verdict = f"does not hold: `lynx` differs from `int8` on {total - same} of {total} items"
    return [claim, "; ".join(parts) or "not measured", verdict]


def _equal_scores(doc: dict, reference: str, candidate: str) -> tuple[int, int]:
    """Items both variants answered, and of those the ones `candidate` scored as `reference` did."""
    equal = judged = 0
    for data in doc["models"].values():
        ref = {r["item"]: r["score"] for r in data["variants"].get(reference, {}).get("items", [])}
        for record in data["variants"].get(candidate, {}).get("items", []):
            if record["item"] in ref:
                judged += 1
                equal += record["score"] == ref[record["item"]]
    return equal, judged


def _faster_than_int8(doc: dict) -> list[str]:
    claim = f"TTFT up to {PAPER_SPEEDUP:g}x better than 8-bit"
    ratios = _per_model_ratios(doc, "int8", "lynx")
    if not ratios:
        return [claim, "not measured", "not measured"]
    measured = f"`int8` TTFT / `lynx` TTFT: {_ratio_text(doc, ratios, '; ')} (at {', '.join(_targets(doc))})"
    cluster = [r["int8_over_lynx"] for r in doc.get("cluster", {}).get("ratios", [])]
    if cluster:
        measured += f". Estimate at cluster scale: {min(cluster):.2f}-{max(cluster):.2f}x"
    best = max(r for v in ratios.values() for r in v)
    verdict = "reached" if best >= PAPER_SPEEDUP else "not reached at these link rates"
    return [claim, measured, f"{verdict}: best measured {best:.2f}x"]


def _against_cachegen(doc: dict) -> list[str]:
    claim = "accuracy up to 5.1% better than CacheGen"
    scores = {m: _scores(d) for m, d in doc["models"].items()}
    pairs = [(m, s) for m, s in scores.items() if "lynx" in s and "int4" in s]
    texts = [f"{_label(doc, m)} {'task score ' if i == 0 else ''}{s['lynx']:.2f}{' (`lynx`)' if i == 0 else ''} vs "
             f"{s['int4']:.2f}{' (`int4`)' if i == 0 else ''}" for i, (m, s) in enumerate(pairs)]  # fmt: skip
    measured = "no CacheGen here. Against plain 4-bit (`int4`, the same anchor bytes): " + ("; ".join(texts) or "not measured")
    verdict = "not comparable"
    with_bf16 = [(m, s) for m, s in pairs if "bf16" in s]
    if with_bf16:
        kept = sum(s["lynx"] >= s["bf16"] for _, s in with_bf16)
        lost = [_label(doc, m) for m, s in with_bf16 if s["int4"] < s["bf16"]]
        verdict += (f"; `lynx`'s mean score equals `bf16`'s on {kept} of {len(with_bf16)} models, `int4`'s is lower on "
                    f"{_and(lost) or 'none'}")  # fmt: skip
    return [claim, measured, verdict]


def accuracy_markdown(doc: dict) -> str:
    """| model | task | <variants> |: mean score per task; "(n items)" where a variant ran fewer of them."""
    variants, rows = doc["variants"], []
    for model, data in doc["models"].items():
        for (task, tokens), specs in _task_groups(doc["plans"][model]["items"]).items():
            stats = [data["variants"].get(n, {}).get("summary", {}).get("by_task", {}).get(f"{task}@{tokens}")
                     for n in variants]  # fmt: skip
            most = max((s["items"] for s in stats if s), default=0)
            cells = ["—" if s is None else f"{s['mean_score']:.2f}" + (f" ({_items(s['items'])})" if s["items"] < most else "")
                     for s in stats]  # fmt: skip
            rows.append([_label(doc, model), _task_label(task, tokens, specs), *cells])
    return _table(["model", "task", *variants], rows)


def _task_groups(specs: Sequence[dict]) -> dict[tuple[str, int], list[dict]]:
    """The plan's item specs by (task, prompt tokens), in plan order: `accuracy.summarize`'s ``by_task`` keys."""
    groups: dict[tuple[str, int], list[dict]] = {}
    for spec in specs:
        groups.setdefault((spec["task"], spec["tokens"]), []).append(spec)
    return groups


def _items(n: int) -> str:
    return f"{n} item{'s' if n != 1 else ''}"


def _task_label(task: str, tokens: int, specs: Sequence[dict]) -> str:
    size = f"{tokens // 1024}k" if tokens % 1024 == 0 else f"{tokens:,}"
    parts = [TASK_NAMES.get(task, task), f"{size} tokens"]
    depths = list(dict.fromkeys(s["depth"] for s in specs)) if task in DEPTH_TASKS else []
    if depths:
        parts.append(f"depth{'s' if len(depths) > 1 else ''} {'/'.join(f'{d:g}' for d in depths)}")
    if len(specs) > max(len(depths), 1) or not depths:
        parts.append(_items(len(specs)))
    return ", ".join(parts)


def likelihood_markdown(doc: dict) -> str:
    """| context KV | per model: KL, top-1 agreement |, each a mean with its 95% interval."""
    summaries = {m: d.get("likelihood", {}).get("summary", {}) for m, d in doc["models"].items()}
    header = ["context KV"]
    for index, model in enumerate(summaries):
        header += [f"{_label(doc, model)} KL" + (", nats/token" if index == 0 else ""), f"{_label(doc, model)} top-1 agreement"]
    rows = []
    for codec in dict.fromkeys(c for s in summaries.values() for c in s):
        row = [f"{codec} ({CODEC_ROLES[codec]})" if codec in CODEC_ROLES else codec]
        for summary in summaries.values():
            s = summary.get(codec)
            row += [_interval(s["kl"], _e), _interval(s["top1_agree"], lambda v: f"{v:.3f}")] if s else ["—", "—"]
        rows.append(row)
    return _table(header, rows)


def _interval(ci: dict, fmt: Callable[[float], str]) -> str:
    if ci["mean"] is None:
        return "—"
    return f"{fmt(ci['mean'])} [{fmt(ci['low'])}, {fmt(ci['high'])}]"


def speed_markdown(doc: dict) -> str:
    """| model | xfer/prefill | <variants' TTFT s> | lynx tN / int8 tN ... | lynx accepted / drafted |."""
    variants = doc["variants"]
    later = sorted({n for p in doc["plans"].values() for n in p.get("nth", ()) if n > 1})
    header = ["model", "xfer/prefill", *variants, *(f"lynx t{n} / int8 t{n}" for n in later), "lynx accepted / drafted"]
    rows = []
    for model, data in doc["models"].items():
        for group in _rates(data.get("speed", [])):
            lynx = group.get("lynx", {})
            drafted = f"{lynx['accepted_tokens']} / {lynx['speculative_tokens']}" if "speculative_tokens" in lynx else "—"
            rows.append([_label(doc, model), _f(next(iter(group.values()))["bf16_transfer_to_prefill"]),
                         *(_f(group.get(v, {}).get("t1_s")) for v in variants),
                         *(_f(_ratio(group, "lynx", "int8", f"t{n}_s")) for n in later), drafted])  # fmt: skip
    return _table(header, rows)


def timings_markdown(doc: dict) -> str:
    """| model | variant | started early | start s | speed s | items s |, from each variant's ``timings``."""
    rows = []
    for model, data in doc["models"].items():
        for name, record in data["variants"].items():
            t = record.get("timings")
            if t:
                rows.append([_label(doc, model), name, EARLY.get(t.get("early_start") or "", "no"),
                             *(_f(t.get(k), ".0f") for k in ("start_wait_s", "speed_s", "items_s"))])  # fmt: skip
    return _table(["model", "variant", "started early", "start s", "speed s", "items s"], rows)
