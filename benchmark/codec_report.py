"""The docs' tables of the codec's bytes and quality, rebuilt from their JSON (`scripts/doc_tables.py`).

``bytes_markdown`` reads ``codec_bytes.py --json``; ``quality_markdown``,
``anchor_markdown`` and ``residual_markdown`` read ``codec_quality.py
--candidates --json``. Each takes the parsed JSON and returns Markdown.
"""

from __future__ import annotations

import doc_markdown as md

STREAM_NAMES = {1: "anchor", 2: "residual"}


def bytes_markdown(document: dict) -> str:
    """Per model shape: each spec's bytes per further token of each stream (in parentheses the
    fraction of BF16's), of all streams, and the sink tokens' fixed cost per request; then each
    stream of ``int8`` per token of whole requests of the JSON's lengths, sink tokens included."""
    lines = []
    for shape in document["shapes"]:
        bf16 = shape["bf16_bytes_per_token"]
        lines += [f"**{shape['model']}** ({shape['kv_heads']} KV heads × {shape['head_dim']}, "
                  f"{shape['layers']} layers; BF16: {bf16 // shape['layers']:,} B per layer, {bf16:,} B in all):", "",
                  *md.head(["preset", "anchor", "residual(s)", "all streams", "sink tokens per request"])]  # fmt: skip
        for row in shape["specs"]:
            anchor, *residuals = row["stream_bytes_per_token"]
            residual = "—" if not residuals else (" + ".join(f"{b:,.0f}" for b in residuals)
                                                  + " (" + " + ".join(f"{b / bf16:.3f}" for b in residuals) + ")")
            fixed_anchor, *fixed_residuals = row["sink_bytes_per_request"]
            fixed = f"anchor {_signed_bytes(fixed_anchor)}"
            if fixed_residuals:
                word = "residual" if len(fixed_residuals) == 1 else "residuals"
                fixed += f", {word} " + " and ".join(_signed_bytes(b)[:-2] for b in fixed_residuals) + " B"
            total = sum(row["stream_bytes_per_token"])
            cells = [spec_label(row["spec"]), f"{anchor:,.0f} ({anchor / bf16:.3f})", residual,
                     f"{total:,.0f} ({total / bf16:.3f})", fixed]  # fmt: skip
            lines.append(md.line(cells))
        lines.append("")
    first = document["shapes"][0]
    int8 = next(row for row in first["specs"] if row["spec"] == "int8")
    parts = [f"{point['tokens']:,} tokens {_streams(point['stream_bytes_per_token'], first['bf16_bytes_per_token'])}"
             for point in int8["at_tokens"]]  # fmt: skip
    lines.append(f"`int8` per token of whole {first['model']} requests (sink tokens included): "
                 + "; ".join(parts) + ".")
    return "\n".join(lines) + "\n"


def quality_markdown(document: dict) -> str:
    """The run's setting, then one row per spec and number of streams used (the presets and 2+2+4),
    with the gaps of the BF16 cache's top-2 at the positions where the decoded cache parts."""
    config = document["config"]
    positions = config["num_prompts"] * config["continuation"]
    essays = [str(index) for index in config["prompt_essay_indices"]]
    essays_text = essays[0] if len(essays) == 1 else ", ".join(essays[:-1]) + " and " + essays[-1]
    lines = [f"{config['date']}, {config['model']}: {config['num_prompts']} essay excerpts of "
             f"{config['prompt_tokens']:,} tokens (essays {essays_text}), {config['prefix_tokens']:,} prefilled; "
             f"attention error over the last {config['queries']} prefix positions ({config['query_heads']} query "
             f"heads, {config['kv_heads']} KV heads); {config['continuation']} tokens teacher-forced: {positions} "
             f"positions (one is {1 / positions:.3f} of agreement), {config['near_tie_positions']} near ties on the "
             f"BF16 cache.", "",
             *md.head(["spec", "streams used", "B/token used", "of BF16", "attn err mean", "attn err max",
                      "top-1 agree", "parted (near tie)", "top-2 gap"])]  # fmt: skip
    for row in document["results"]:
        if "study" in row:
            continue
        lines.append(md.line([spec_label(row["spec"]), f"{row['stages']}/{row['num_stages']}",
                           f"{row['bytes_per_token']:,.1f}", f"{row['of_bf16']:.4f}", *_quality(row), _gaps(row)]))
    return "\n".join(lines) + "\n"


def anchor_markdown(document: dict) -> str:
    """The anchor designs, decoded from the anchor alone: bytes per token and their change, and
    attention error's change, against the baseline design."""
    rows = _study(document, "anchor")
    base = next(row for row in rows if row.get("role") == "baseline")
    lines = [*md.head(["design", "B/token", "bytes", "attn err mean", "attn err max", "top-1 agree",
                      "parted (near tie)"])]
    for row in rows:
        mean, *rest = _quality(row)
        if row is not base:
            mean += f" ({_percent(row['attn_err_mean'] / base['attn_err_mean'] - 1, 1)})"
        change = "—" if row is base else _percent(row["bytes_per_token"] / base["bytes_per_token"] - 1, 2)
        lines.append(md.line([design_label(row), f"{row['bytes_per_token']:,.1f}", change, mean, *rest]))
    return "\n".join(lines) + "\n"


def residual_markdown(document: dict) -> str:
    """The residual designs (a 4-bit anchor refined by 4 more bits), decoded from every stream."""
    lines = [*md.head(["design", "B/token", "attn err mean", "attn err max", "top-1 agree", "parted (near tie)"])]
    for row in _study(document, "residual"):
        lines.append(md.line([design_label(row), f"{row['bytes_per_token']:,.1f}", *_quality(row)]))
    return "\n".join(lines) + "\n"


def spec_label(name: str) -> str:
    """A preset's name in code type; a spec of stage widths (``2+2+4``) as it is."""
    return name if name.replace("+", "").isdigit() else f"`{name}`"


def design_label(row: dict) -> str:
    """A design's name, marked simulated (a plain-PyTorch model) and adopted (in bold)."""
    label = row["spec"]
    if row.get("simulated"):
        label = label[:-1] + "; simulated)" if label.endswith(")") else label + " (simulated)"
    if row.get("role") == "adopted":
        label = "**" + (label[:-1] + "; adopted)" if label.endswith(")") else label + " (adopted)") + "**"
    return label


def _study(document: dict, study: str) -> list[dict]:
    return [row for row in document["results"] if row.get("study") == study]


def _quality(row: dict) -> list[str]:
    return [_error(row["attn_err_mean"]), _error(row["attn_err_max"]), f"{row['agreement']:.4f}",
            f"{row['parted']} ({row['parted_near_tie']})"]  # fmt: skip


def _gaps(row: dict) -> str:
    gaps = [f"{gap:.3f}" for gap in sorted(row["parted_gaps"])]
    if len(gaps) > 2:
        return f"{gaps[0]}–{gaps[-1]}"
    return " and ".join(gaps) or "—"


def _error(value: float) -> str:
    return "0" if value == 0 else f"{value:.3e}"


def _percent(fraction: float, digits: int) -> str:
    text = f"{abs(fraction) * 100:.{digits}f} %"
    return ("−" if fraction < 0 and float(text[:-2]) else "+") + text


def _signed_bytes(value: float) -> str:
    return ("−" if value < 0 else "+") + f"{abs(value):,.0f} B"


def _streams(values: list[float], bf16: int) -> str:
    named = [f"{STREAM_NAMES.get(i, f'stream {i}')} {b:,.1f} B ({b / bf16:.4f})" for i, b in enumerate(values, 1)]
    return ", ".join(named)
