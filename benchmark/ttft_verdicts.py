"""What the TTFT sweep's rows show: lynx against int4 and int8, pipelining on against off, the
overlap of transfer and prefill (`overlap`) and lynx's outputs against int8's (`agreement`, with
the judgement `ttft_outputs` records), per point of the sweep. Pure arithmetic on the rows."""

from __future__ import annotations

import statistics

import doc_markdown as md

FLOOR = "floor"  # the rows of the single non-disaggregated server


def verdicts(rows: list[dict]) -> list[dict]:
    """Per (link rate, prompt length, request type), at the first segment size: lynx t1 / int4 t1,
    lynx tN / int8 tN and lynx t1 / the floor's t1. Where the sweep ran pairs side by side
    (rows with a ``group``), each ratio takes the ``lynx`` row timed beside the compared mode, and
    ``paired`` adds the median of the per-request ratios (repeat ``i`` of one mode against repeat
    ``i`` of the other: the same prompt, seconds apart), which a drift of the machine's speed
    across the run moves less than it moves the medians. The verdict (``met``) uses the medians."""
    index = _served_points(rows)
    out = []
    for (mode, rate, tokens, kind), lynx_rows in index.items():
        if mode != "lynx":
            continue
        floor = _first(index.get((FLOOR, None, tokens, kind)))
        lynx4, int4 = _beside(lynx_rows, index.get(("int4", rate, tokens, kind)))
        lynx8, int8 = _beside(lynx_rows, index.get(("int8", rate, tokens, kind)))
        entry = {"link_gbps": rate, "prompt_tokens": tokens, "request_type": kind}
        if int4 and int4.get("t1_s") and lynx4.get("t1_s"):
            entry["t1_vs_int4"] = lynx4["t1_s"] / int4["t1_s"]
        later_keys = [key for key in nth_keys([lynx8]) if key != "t1_s"]
        for key in later_keys:
            if int8 and int8.get(key) and lynx8.get(key):
                entry[f"{key[:-2]}_vs_int8"] = lynx8[key] / int8[key]
        paired = _paired(lynx4, int4, ["t1_s"], "int4") | _paired(lynx8, int8, later_keys, "int8")
        if paired:
            entry["paired"] = paired
        later = [v for k, v in entry.items() if k.endswith("_vs_int8")]
        if "t1_vs_int4" in entry or later:  # None: no int4 or int8 row at this point to judge by
            entry["met"] = entry.get("t1_vs_int4", 0) <= 1.05 and all(v <= 1.0 for v in later)
        else:
            entry["met"] = None
        if floor and floor.get("t1_s") and lynx_rows[0].get("t1_s"):
            entry["t1_vs_floor"] = lynx_rows[0]["t1_s"] / floor["t1_s"]
        out.append(entry)
    return out


def _served_points(rows: list[dict]) -> dict[tuple, list[dict]]:
    """The rows at the first row's segment size and transport (and the floor's), by (mode, link
    rate, prompt length, request type)."""
    served = (rows[0]["segment_tokens"], rows[0].get("transport")) if rows else (None, None)
    index: dict[tuple, list[dict]] = {}
    for r in rows:
        if r["segment_tokens"] is None or (r["segment_tokens"], r.get("transport")) == served:
            index.setdefault((r["mode"], r["link_gbps"], r["prompt_tokens"], r["request_type"]), []).append(r)
    return index


def _paired(lynx: dict, other: dict | None, keys: list[str], name: str) -> dict[str, float]:
    """Per key, the median of lynx's run-by-run ratios to `other`'s when both rows were timed
    side by side (one ``group``) over the same repeats; {} otherwise."""
    if other is None or other.get("group") is None or lynx.get("group") != other.get("group"):
        return {}
    runs, other_runs = lynx.get("runs") or [], other.get("runs") or []
    if not runs or len(runs) != len(other_runs):
        return {}
    out = {}
    for key in keys:
        ratios = [a[key] / b[key] for a, b in zip(runs, other_runs) if a.get(key) and b.get(key)]
        if ratios:
            out[f"{key[:-2]}_vs_{name}"] = statistics.median(ratios)
    return out


def _first(rows: list[dict] | None) -> dict | None:
    return rows[0] if rows else None


def _beside(lynx_rows: list[dict], others: list[dict] | None) -> tuple[dict, dict | None]:
    """The ``lynx`` row and the compared mode's row to set against it: a pair from one group of
    side-by-side deployments if there is one, else the first of each."""
    for other in others or ():
        for lynx in lynx_rows:
            if other.get("group") is not None and lynx.get("group") == other.get("group"):
                return lynx, other
    return lynx_rows[0], _first(others)


def judged_pairs(rows: list[dict]) -> list[tuple[dict, dict]]:
    """Each ``lynx`` row with the ``int8`` row whose runs answered the same requests (the same link
    rate, prompt length, request type, segments and transport; the row timed beside it where the
    sweep ran side by side)."""
    index: dict[tuple, list[dict]] = {}
    for r in rows:
        key = (r["link_gbps"], r["prompt_tokens"], r["request_type"], r["segment_tokens"], r.get("transport"))
        index.setdefault((r["mode"], *key), []).append(r)
    pairs = []
    for (mode, *key), lynx_rows in index.items():
        if mode == "lynx" and ("int8", *key) in index:
            pairs.append(_beside(lynx_rows, index[("int8", *key)]))
    return pairs


def agreement(rows: list[dict]) -> list[dict]:
    """Per (link rate, prompt length, request type, segments, transport): how ``lynx``'s outputs
    compare with ``int8`` mode's for the same requests, repeat by repeat. ``compared`` / ``equal`` /
    ``parted_repeats``: the digests of the output texts (``output_sha``); ``judged``: every token
    judged (`ttft_outputs.judge_rows`: equal, equal after near ties, wrong, unchecked, each parting
    with its gap), where the sweep recorded tokens."""
    out = []
    for lynx, int8 in judged_pairs(rows):
        pairs = {i: (a.get("output_sha"), b.get("output_sha")) for i, (a, b) in enumerate(zip(lynx["runs"], int8["runs"]))}
        pairs = {i: (a, b) for i, (a, b) in pairs.items() if a is not None and b is not None}
        parted = [i for i, (a, b) in pairs.items() if a != b]
        entry = {k: lynx.get(k) for k in ("link_gbps", "prompt_tokens", "request_type", "segment_tokens", "transport")}
        entry |= {"compared": len(pairs), "equal": len(pairs) - len(parted), "parted_repeats": parted}
        if "judged" in lynx:
            entry["judged"] = lynx["judged"]
        out.append(entry)
    return out


def pipelining(rows: list[dict]) -> list[dict]:
    """Per mode, link rate, prompt length and request type: t1 with segments over t1 with the KV sent whole."""
    whole = {(r["mode"], r["link_gbps"], r["prompt_tokens"], r["request_type"], r.get("transport")): r
             for r in rows if r["segment_tokens"] == 0}  # fmt: skip
    out = []
    for r in rows:
        key = (r["mode"], r["link_gbps"], r["prompt_tokens"], r["request_type"], r.get("transport"))
        if r["segment_tokens"] and key in whole and r.get("t1_s") and whole[key].get("t1_s"):
            out.append({"mode": r["mode"], "link_gbps": r["link_gbps"], "prompt_tokens": r["prompt_tokens"],
                        "request_type": r["request_type"], "segment_tokens": r["segment_tokens"],
                        "t1_on_over_off": r["t1_s"] / whole[key]["t1_s"]})  # fmt: skip
    return out


def nth_keys(records: list[dict]) -> list[str]:
    """The ``t{n}_s`` keys (time to the n-th token) present in `records`, by n."""
    keys = {k for r in records for k in r if k.startswith("t") and k.endswith("_s") and k[1:-2].isdigit()}
    return sorted(keys, key=lambda k: int(k[1:-2]))


def overlap(rows: list[dict]) -> list[dict]:
    """Per link rate, prompt length and request type, at the first segment size: how far ``lynx``'s
    first token is from the bound of a transfer that overlaps the prefill, and the int8 / lynx ratio.

    The bound is max(the prefill, the anchor's bytes at the link rate) plus one decode step (the
    mean step from the 1st to the last reported token of the ``int4`` row at the same point, else
    the ``int8`` row: ``lynx`` holds its drafted tokens back, so its own steps are not decode
    steps; without either, the ``lynx`` row's own). The prefill is the prefill
    server's own time for the row's requests (`request_prefill_s`, with ``--via direct``), else the
    deployment's calibration request (`prefill_s`).
    """
    served = rows[0]["segment_tokens"] if rows else None
    index = {(r["mode"], r["link_gbps"], r["prompt_tokens"], r["request_type"]): r for r in rows
             if r["segment_tokens"] == served}  # fmt: skip
    out = []
    for (mode, rate, tokens, kind), lynx in index.items():
        prefill = lynx.get("request_prefill_s") or lynx.get("prefill_s")
        if mode != "lynx" or not rate or not lynx.get("t1_s") or not prefill:
            continue
        anchor_s = lynx["stream_bytes"][0] * 8 / (rate * 1e9)
        stepping = next((r for r in (index.get((m, rate, tokens, kind)) for m in ("int4", "int8")) if r), lynx)
        last = nth_keys([stepping])[-1]
        steps = int(last[1:-2]) - 1
        step_s = (stepping[last] - stepping["t1_s"]) / steps if steps > 0 else 0.0
        bound = max(prefill, anchor_s) + step_s
        entry = {"link_gbps": rate, "prompt_tokens": tokens, "request_type": kind, "anchor_s": anchor_s,
                 "prefill_s": prefill, "step_s": step_s, "t1_vs_bound": lynx["t1_s"] / bound}  # fmt: skip
        int8 = index.get(("int8", rate, tokens, kind))
        if int8 and int8.get("t1_s"):
            entry["int8_over_lynx_t1"] = int8["t1_s"] / lynx["t1_s"]
        out.append(entry)
    return out


def markdown(document: dict) -> str:
    """The docs' table of a ``--side-by-side`` sweep's JSON (`scripts/doc_tables.py`): per link rate
    and request type, each ``lynx`` row against the mode timed beside it (medians; in brackets the
    median of per-request ratios), what ``lynx`` drafted, its answers judged against ``int8``'s, the
    verdict; then the totals, and every parting with its gap. The ``int4`` columns are left out of a
    sweep that ran no ``int4`` pair."""
    rows = document["rows"]
    index = _served_points(rows)
    later = [k for k in nth_keys(rows) if k != "t1_s"]
    with4 = any(r["mode"] == "int4" for r in rows)
    header = ["BF16 xfer / prefill", "type", *(["`int4` t1", "`lynx` t1", "lynx/int4 t1"] if with4 else []), "`int8` t1", "`lynx` t1",
              *[f"lynx/int8 {k[:-2]}" if i == 0 else k[:-2] for i, k in enumerate(later)],
              "drafted (accepted)", "rollbacks", "`lynx` = `int8`", "verdict"]  # fmt: skip
    lines = md.head(header)
    if document.get("date"):
        minutes = f", {document['wall_s'] / 60:.0f} min" if document.get("wall_s") else ""
        lines[:0] = [f"{document['date']}, commit {document['commit']}{minutes}; medians of "
                     f"{document['args']['repeats']} repeats, seconds:", ""]  # fmt: skip
    entries = {(e["link_gbps"], e["prompt_tokens"], e["request_type"]): e for e in verdicts(rows)}
    judged, partings = [], []
    for (mode, rate, tokens, kind), lynx_rows in index.items():
        if mode != "lynx":
            continue
        entry = entries[(rate, tokens, kind)]
        lynx4, int4 = _beside(lynx_rows, index.get(("int4", rate, tokens, kind)))
        lynx8, int8 = _beside(lynx_rows, index.get(("int8", rate, tokens, kind)))
        ratios = [_ratio(entry, f"{k[:-2]}_vs_int8") for k in later]
        spans = [r["bf16_transfer_to_prefill"] for r in rows if r["link_gbps"] == rate and r.get("bf16_transfer_to_prefill")]
        verdict = {True: "met", False: "miss", None: "-"}[entry["met"]]
        versus4 = [_seconds(int4), _seconds(lynx4 if int4 else None), _ratio(entry, "t1_vs_int4")] if with4 else []
        cells = [_span(spans), kind, *versus4, _seconds(int8), _seconds(lynx8 if int8 else None), *ratios, _drafted(lynx_rows),
                 str(sum(r.get("rollbacks", 0) for r in lynx_rows)), _judged(lynx8.get("judged")), verdict]  # fmt: skip
        lines.append(md.line(cells))
        if lynx8.get("judged"):
            judged.append(lynx8["judged"])
            partings += [(rate, kind, p) for p in lynx8["judged"]["partings"]]
    met = [e["met"] for e in entries.values() if e["met"] is not None]
    totals = {k: sum(j[k] for j in judged) for k in ("answers", "tokens_judged", "wrong", "near_ties")}
    lines += ["", f"{sum(met)} of {len(met)} cells meet the bar; `lynx`'s answers judged against `int8`'s: "
              f"{totals['answers']} answers, {totals['tokens_judged']:,} tokens, {md.count(totals['near_ties'], 'near tie')}, "
              f"{totals['wrong']} wrong" + _drift(judged) + ("." if not partings else ":")]  # fmt: skip
    for rate, kind, p in partings:
        gap = "" if p.get("gap") is None else f", gap {p['gap']:.4f} nats"
        lines.append(f"- {rate:g} Gbit/s, {kind}, repeat {p['request']}: {p['kind'].replace('_', ' ')} at output "
                     f"token {p['position']}{gap}")  # fmt: skip
    return "\n".join(lines) + "\n"


def _ratio(entry: dict, key: str) -> str:
    if key not in entry:
        return "-"
    paired = entry.get("paired", {}).get(key)
    return f"{entry[key]:.2f}" + (f" ({paired:.2f})" if paired is not None else "")


def _seconds(row: dict | None) -> str:
    return "-" if not row or row.get("t1_s") is None else f"{row['t1_s']:.2f}"


def _span(values: list[float]) -> str:
    if not values:
        return "-"
    low, high = f"{min(values):.1f}", f"{max(values):.1f}"
    return low if low == high else f"{low}-{high}"


def _drafted(lynx_rows: list[dict]) -> str:
    return ", ".join(f"{r.get('speculative_tokens', 0)} ({r.get('accepted_tokens', 0)})" for r in lynx_rows)


def _drift(judged: list[dict]) -> str:
    """How far the greedy answers' returned logprobs are from int8's, over every judged row that has them:
    the output tokens', then the other top-list entries' and the asked token ids' where recorded."""
    drifts = [j["logprob_drift"] for j in judged if j.get("logprob_drift")]
    if not drifts:
        return ""
    text = (f"; returned logprobs of the same greedy tokens within {_most(drifts)} of `int8`'s "
            f"({_mean(drifts, 'positions')})")
    for kind, words in (("top", "of the other top-list tokens"), ("token_ids", "of the asked token ids")):
        more = [j["logprob_drift_more"][kind] for j in judged if kind in j.get("logprob_drift_more", {})]
        if more:
            text += f", {words} within {_most(more)} ({_mean(more, 'values')})"
    return text


def _most(stats: list[dict]) -> str:
    return f"{max(s['max'] for s in stats):.3f} nats"


def _mean(stats: list[dict], counted: str) -> str:
    count = sum(s[counted] for s in stats)
    mean = sum(s["mean"] * s[counted] for s in stats) / count
    return f"{count:,} {counted}, mean {mean:.4f}"


def _judged(judged: dict | None) -> str:
    if not judged:
        return "not judged"
    text = f"{judged['equal'] + judged['equal_after_near_ties']} of {judged['answers']}"
    if judged["near_ties"]:
        text += f", {md.count(judged['near_ties'], 'near tie')}"
    if judged["wrong"]:
        text += f", {judged['wrong']} wrong"
    if judged["tokens_unchecked"]:
        text += f", {judged['tokens_unchecked']} tokens unchecked"
    return text
