"""The docs' tables of the codec's speed, rebuilt from their JSON (`scripts/doc_tables.py`).

``throughput_markdown`` and ``throughput_ms_markdown`` read ``codec_throughput.py
--json`` (the reference codec on a CPU); ``gpu_bandwidth_markdown`` and
``gpu_bandwidth_sentence`` read the JSON of ``scripts/gpu_check_kernels.py``
(the Triton kernels). Each takes the parsed JSON and returns Markdown.
"""

from __future__ import annotations

import doc_markdown as md

GPU_OPS = {"encode": "encode", "decode anchor": "decode anchor only", "decode all": "decode all streams"}


def throughput_markdown(document: dict) -> str:
    """The run's setting, then per shape: GB/s of BF16 input of every op and preset, in parentheses
    the fraction of a plain copy's, and the baselines measured in the same run."""
    config = document["config"]
    lines = [_setting(config), ""]
    for shape in document["shapes"]:
        presets = _presets(shape)
        lines += [_shape_title(shape) + ":", "",
                  *md.head(["op", *[f"`{p}` GB/s (vs copy)" if i == 0 else f"`{p}`" for i, p in enumerate(presets)]])]
        for op, cells in _op_rows(shape, presets):
            text = [_cell(row, lambda r: f"{r['gb_per_s']:.3f} ({r['vs_copy']:.4f})") for row in cells]
            lines.append(md.line([op, *text]))
        copy, gather = _baselines(shape)
        lines += ["", f"Baselines in the same run: copy {copy['gb_per_s']:.1f} GB/s, "
                      f"gather `pool[slots]` {gather['gb_per_s']:.2f} GB/s.", ""]  # fmt: skip
    return "\n".join(lines).rstrip("\n") + "\n"


def throughput_ms_markdown(document: dict) -> str:
    """Median milliseconds of every op, one column per shape and preset; then the baselines."""
    shapes = document["shapes"]
    columns = [(shape, preset) for shape in shapes for preset in _presets(shape)]
    names = [f"{_shape_short(s)} `{p}`" if p == _presets(s)[0] else f"`{p}`" for s, p in columns]
    lines = md.head(["median ms", *names])
    per_shape = [dict(_op_rows(shape, _presets(shape))) for shape in shapes]
    for op in per_shape[0]:
        cells = [per_shape[shapes.index(s)][op][_presets(s).index(p)] for s, p in columns]
        lines.append(md.line([op, *[_cell(row, lambda r: _ms(r["median_s"])) for row in cells]]))
    baselines = [(_shape_short(s), *(_ms(row["median_s"]) for row in _baselines(s))) for s in shapes]
    lines += ["", "Baselines in the same run, ms: " + "; ".join(
        f"{name}: copy {copy}, gather `pool[slots]` {gather}" for name, copy, gather in baselines) + "."]
    return "\n".join(lines) + "\n"


def gpu_bandwidth_markdown(document: dict) -> str:
    """GB/s of every kernel op and entry point per preset, kernel rows with the fraction of a
    device copy in parentheses; then the copy, gather and scatter bandwidths of the same run."""
    shape, rows = document["shape"], document["bandwidth"]
    presets = list(dict.fromkeys(row["preset"] for row in rows))
    title = f"{shape['tokens']:,} tokens ({_mib(shape):,.0f} MiB of K+V)"
    lines = md.head([title, *[f"`{p}`" for p in presets]])
    for op, path in dict.fromkeys((row["op"], row["path"]) for row in rows):
        cells = [next(r for r in rows if (r["op"], r["path"], r["preset"]) == (op, path, p)) for p in presets]
        text = [f"{r['GB/s']:,.0f} ({r['vs copy']:.3f})" if path == "kernel" else f"{r['GB/s']:,.0f}" for r in cells]
        lines.append(md.line([f"{GPU_OPS.get(op, op)}, {path}", *text]))
    copy, gather, scatter = _gpu_baselines(rows)
    lines += ["", f"{document['device']}, medians of {document['repeats']} CUDA-event timings; in parentheses the "
                  f"fraction of a device copy of the same bytes in the same run ({copy:,.0f} GB/s; index gather of "
                  f"the pool rows {gather:,.0f}, scatter {scatter:,.0f})."]  # fmt: skip
    return "\n".join(lines) + "\n"


def gpu_bandwidth_sentence(document: dict) -> str:
    """One sentence of a run's kernel GB/s (encode, anchor decode, full decode per preset) and baselines."""
    shape, rows = document["shape"], document["bandwidth"]
    kernel = {(r["preset"], r["op"]): r["GB/s"] for r in rows if r["path"] == "kernel"}
    parts = []
    for index, preset in enumerate(dict.fromkeys(row["preset"] for row in rows)):
        figures = [f"{kernel[(preset, op)]:,.0f}" for op in GPU_OPS]
        names = ("encode ", "anchor decode ", "full decode ") if index == 0 else ("",) * 3
        parts.append(f"`{preset}` " + ", ".join(name + figure for name, figure in zip(names, figures)))
    copy, gather, scatter = _gpu_baselines(rows)
    return (f"{shape['tokens']:,} tokens ({_mib(shape):,.0f} MiB), kernel GB/s: " + "; ".join(parts)
            + f"; copy {copy:,.0f}, gather {gather:,.0f}, scatter {scatter:,.0f}.\n")


def _setting(config: dict) -> str:
    load = config.get("load_average")
    busy = f", load average {load[0]:.1f} before and {load[1]:.1f} after" if load else ""
    return (f"{config['date']}, {config['processor']}, {md.count(config['threads'], 'torch thread')}{busy}; median "
            f"of {md.count(config['repeats'], 'run')} after {md.count(config['warmup'], 'warm-up run')}.")


def _presets(shape: dict) -> list[str]:
    return list(dict.fromkeys(row["preset"] for row in shape["rows"] if row["preset"] != "-"))


def _op_rows(shape: dict, presets: list[str]) -> list[tuple[str, list]]:
    """``(op label, [row or None per preset])`` in the JSON's order; a one-stream preset's decode
    counts as anchor only."""
    table: dict[str, list] = {}
    for row in shape["rows"]:
        if row["preset"] == "-":
            continue
        name, _, stages = row["op"].partition(" ")
        if stages:
            name = f"`{name}`" if name != "decode" else name
            name += ", anchor only" if stages.startswith("1/") else ", all streams"
        elif name != "encode":
            name = f"`{name}`"
        table.setdefault(name, [None] * len(presets))[presets.index(row["preset"])] = row
    return list(table.items())


def _baselines(shape: dict) -> tuple[dict, dict]:
    copy, gather = (row for row in shape["rows"] if row["preset"] == "-")
    return copy, gather


def _gpu_baselines(rows: list[dict]) -> tuple[float, float, float]:
    encode = next(r for r in rows if r["op"] == "encode")
    decode = next(r for r in rows if r["op"] != "encode")
    return encode["copy GB/s"], encode["gather/scatter GB/s"], decode["gather/scatter GB/s"]


def _shape_title(shape: dict) -> str:
    return (f"{shape['tokens']:,} tokens × {shape['kv_heads']} KV heads × {shape['head_dim']} "
            f"({shape['bf16_bytes'] / (1 << 20):g} MiB of BF16 K+V)")


def _shape_short(shape: dict) -> str:
    return f"{shape['tokens']}×{shape['kv_heads']}×{shape['head_dim']}"


def _mib(shape: dict) -> float:
    return 2 * shape["tokens"] * shape["kv_heads"] * shape["head_dim"] * 2 / (1 << 20)


def _cell(row: dict | None, text) -> str:
    return "—" if row is None else text(row)


def _ms(seconds: float) -> str:
    milliseconds = seconds * 1e3
    return f"{milliseconds:.3g}" if milliseconds < 100 else f"{milliseconds:,.0f}"
