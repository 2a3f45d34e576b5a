"""The docs' tables of a TTFT sweep's JSON (`ttft_sweep.py --json`), rebuilt by `scripts/doc_tables.py`.

``transports_markdown``: per mode and transport, the times to the n-th token, the anchor's and the
residual's arrival and ``lynx``'s acceptance. ``pipelining_markdown``: per mode, t1 with the KV
streamed per segment against t1 with it sent whole. ``verify_markdown``: per point, the medians
of ``lynx``'s verify stages after the last residual byte. Each takes the parsed JSON and returns
Markdown; the side-by-side verdict table is `ttft_verdicts.markdown`.
"""

from __future__ import annotations

import statistics

import doc_markdown as md
from ttft_verdicts import _span, nth_keys, pipelining

NONE = "—"
STAGES = ("upgrade_s", "forward_s", "predict_s", "commit_s")  # ttft_sweep.VERIFY_STAGES
# Row fields that tell the points of a sweep apart: header and cell of each, shown where they vary.
POINT_FIELDS = {
    "link_gbps": ("Gbit/s", lambda v: f"{v:g}"),
    "prompt_tokens": ("prompt", lambda v: f"{v:,}"),
    "request_type": ("type", str),
    "segment_tokens": ("segments", lambda v: "whole" if v == 0 else str(v)),
    "transport": ("transport", lambda v: f"`{v}`"),
}


def transports_markdown(document: dict) -> str:
    """Per row (a mode on a transport, and whichever of link rate, prompt length, request type and
    segments vary): the median time to each reported token, the anchor's arrival
    (`anchor_ready_s`), the residual's (`residual_ready_s`, for a wire format of two streams), and
    ``lynx``'s acceptance with its totals."""
    rows = document["rows"]
    fields = ["transport", *_varying(rows, [f for f in POINT_FIELDS if f != "transport"])]
    times = nth_keys(rows)
    header = ["mode", *(POINT_FIELDS[f][0] for f in fields), *(k[:-2] for k in times),
              "anchor landed", "residual landed", "accepted"]  # fmt: skip
    lines = [_lead(document, rows, with_ratio=True), "", *md.head(header)]
    for row in rows:
        residual = row.get("residual_ready_s") if len(row.get("stream_bytes") or ()) > 1 else None
        arrivals = [_seconds(row.get("anchor_ready_s")), _seconds(residual)]
        cells = [f"`{row['mode']}`", *_point_cells(row, fields), *(_seconds(row.get(k)) for k in times), *arrivals]
        lines.append(md.line([*cells, _accepted(row)]))
    return "\n".join(lines) + "\n"


def pipelining_markdown(document: dict) -> str:
    """Per row sent in segments that has a twin sent whole (``--segment-tokens 0``; the same mode,
    link rate, prompt length, request type and transport): the span of BF16 transfer / prefill over
    the pair, t1 of each and their ratio (`ttft_verdicts.pipelining`)."""
    rows = document["rows"]
    pairs = []
    for row in rows:
        whole = _whole_twin(row, rows)
        if row["segment_tokens"] and whole is not None:
            pairs += [(row, whole, entry) for entry in pipelining([row, whole])]
    fields = _varying([row for row, _, _ in pairs], list(POINT_FIELDS))
    header = ["mode", *(POINT_FIELDS[f][0] for f in fields), "BF16 transfer / prefill", "pipelined t1", "whole t1",
              "pipelined / whole"]  # fmt: skip
    lines = [_lead(document, [r for pair in pairs for r in pair[:2]]), "", *md.head(header)]
    for row, whole, entry in pairs:
        spans = [r["bf16_transfer_to_prefill"] for r in (row, whole) if r.get("bf16_transfer_to_prefill")]
        cells = [f"`{row['mode']}`", *_point_cells(row, fields), _span(spans), _seconds(row["t1_s"]),
                 _seconds(whole["t1_s"]), f"{entry['t1_on_over_off']:.3f}"]  # fmt: skip
        lines.append(md.line(cells))
    return "\n".join(lines) + "\n"


def verify_markdown(document: dict) -> str:
    """Per link rate and request type (and whichever of prompt length, segments and transport vary)
    of the ``lynx`` rows: the span of BF16 transfer / prefill, the requests, the tokens drafted
    (accepted) in all, and the median of each verify stage over every request (`stage_medians`)."""
    points: dict[tuple, list[dict]] = {}
    for row in document["rows"]:
        if row["mode"] == "lynx":
            points.setdefault(tuple(row.get(f) for f in POINT_FIELDS), []).append(row)
    lynx_rows = [row for group in points.values() for row in group]
    fields = ["link_gbps", "request_type", *_varying(lynx_rows, ["prompt_tokens", "segment_tokens", "transport"])]
    header = [*(POINT_FIELDS[f][0] for f in fields), "xfer/prefill", "requests", "drafted (accepted)",
              *(f"`{stage}`" for stage in STAGES)]  # fmt: skip
    lines = [_lead(document, lynx_rows), "", *md.head(header)]
    for group in points.values():
        spans = [r["bf16_transfer_to_prefill"] for r in group if r.get("bf16_transfer_to_prefill")]
        drafted = sum(r.get("speculative_tokens", 0) for r in group)
        accepted = sum(r.get("accepted_tokens", 0) for r in group)
        medians = stage_medians(group)
        stages = [NONE if medians is None else f"{medians[stage]:.3f}" for stage in STAGES]
        requests = str(sum(len(r["runs"]) for r in group))
        cells = [*_point_cells(group[0], fields), _span(spans), requests, f"{drafted} ({accepted})", *stages]
        lines.append(md.line(cells))
    return "\n".join(lines) + "\n"


def stage_medians(rows: list[dict]) -> dict[str, float] | None:
    """The median of each verify stage over the runs of `rows` that report stages (a run without a
    stage counts 0, as `ttft_sweep.summarize` counts it); None where no row has them. Over one
    row's runs this is that row's own median."""
    runs = [run for row in rows if STAGES[0] in row for run in row["runs"]]
    if not runs:
        return None
    return {stage: statistics.median(run.get(stage, 0.0) for run in runs) for stage in STAGES}


def _whole_twin(row: dict, rows: list[dict]) -> dict | None:
    """The row sent whole (``segment_tokens`` 0) at `row`'s mode, link rate, prompt, type and transport."""
    key = ("mode", "link_gbps", "prompt_tokens", "request_type", "transport")
    return next((r for r in rows if r["segment_tokens"] == 0 and all(r.get(k) == row.get(k) for k in key)), None)


def _varying(rows: list[dict], fields: list[str]) -> list[str]:
    """The fields of `fields` whose value differs between two of `rows`."""
    return [f for f in fields if len({row.get(f) for row in rows}) > 1]


def _point_cells(row: dict, fields: list[str]) -> list[str]:
    return [NONE if row.get(f) is None else POINT_FIELDS[f][1](row[f]) for f in fields]


def _lead(document: dict, rows: list[dict], with_ratio: bool = False) -> str:
    """The run's date, commit and wall time; the prompt length where one; BF16 transfer / prefill
    (`with_ratio`) and the calibrated prefill, as spans over `rows`; the repeats."""
    parts = []
    if document.get("date"):
        minutes = f", {document['wall_s'] / 60:.0f} min" if document.get("wall_s") else ""
        parts.append(f"{document['date']}, commit {document['commit']}{minutes}")
    tokens = {r["prompt_tokens"] for r in rows}
    if len(tokens) == 1:
        parts.append(f"{tokens.pop():,}-token prompts")
    ratios = [r["bf16_transfer_to_prefill"] for r in rows if r.get("bf16_transfer_to_prefill")]
    if with_ratio and ratios:
        parts.append(f"BF16 transfer / prefill {_span(ratios)}")
    prefills = [r["prefill_s"] for r in rows if r.get("prefill_s")]
    if prefills:
        parts.append(f"calibrated prefill {_span(prefills)} s")
    repeats = sorted({r["repeats"] for r in rows if r.get("repeats")})
    count = "" if not repeats else f" of {repeats[0]}" + (f"-{repeats[-1]}" if len(repeats) > 1 else "") + " repeats"
    return "; ".join([*parts, f"medians{count}, seconds:"])


def _accepted(row: dict) -> str:
    """``lynx``'s acceptance and its totals; a dash for the modes that never draft."""
    if row["mode"] != "lynx":
        return NONE
    if not row.get("speculative_tokens"):
        return "none drafted"
    return f"{row['acceptance']:.2f} ({row['accepted_tokens']} of {row['speculative_tokens']})"


def _seconds(value: float | None) -> str:
    return NONE if value is None else f"{value:.2f}"
