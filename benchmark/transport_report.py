"""The docs' tables of `transport_compare.py --json`, rebuilt by `scripts/doc_tables.py`.

``throughput_markdown``: unpaced Gbit/s per payload, chunk and variant, with Mooncake's ratios to
ZeroMQ's. ``cpu_markdown``: CPU seconds per GB and paced accuracy per variant, then the per-byte
costs. Each takes the parsed JSON and returns Markdown. Only the variants in ``SHOWN`` get a
column; the others stay in the JSON.
"""

from __future__ import annotations

import doc_markdown as md

NONE = "—"
SHOWN = ("zmq", "zmq-curve", "mooncake", "mooncake-engine")
BASELINES = ("zmq", "zmq-curve")  # the variants `transport_compare.unpaced_rows` sets each cell against


def throughput_markdown(document: dict) -> str:
    """Per receive mode, payload and chunk: each shown variant's median Gbit/s (end of ``submit``
    to the last arrival), then ``mooncake``'s ratio to each baseline (the ratio of the medians)."""
    config, rows = document["config"], document["unpaced"]
    variants = _shown(config)
    ratios = [b for b in BASELINES if b in config["variants"]] if "mooncake" in config["variants"] else []
    header = ["payload", "chunk", *(f"`{v}`" for v in variants), *(f"mooncake / {b}" for b in ratios)]
    lines = [_setting(document) + "; medians of the repeats, Gbit/s:", "", *md.head(header)]
    cells = {(r["mode"], r["mib"], r["chunk_kib"], r["variant"]): r for r in rows}
    for mode in config["modes"]:
        for size in sorted(config["sizes"]):
            for chunk in sorted(config["chunks"]):
                key = (mode, size / (1 << 20), chunk // 1024)
                gbps = [_number(cells.get((*key, v), {}).get("gbps"), ".1f") for v in variants]
                mooncake = cells.get((*key, "mooncake"), {})
                shares = [_number(mooncake.get(f"ratio_to_{b}"), ".2f") for b in ratios]
                lines.append(md.line([f"{mode}, {_size(size)}", _size(chunk), *gbps, *shares]))
    return "\n".join(lines) + "\n"


def cpu_markdown(document: dict) -> str:
    """Per shown variant: the span of its sender's and receiver's CPU seconds per GB over every
    unpaced cell's median (receiver: raw / frames), and its paced accuracy (median achieved / set
    rate) at each set rate; then the per-byte costs (`byte_costs_sentence`)."""
    config = document["config"]
    variants = _shown(config)
    unpaced = document["unpaced"]
    paced = {(r["variant"], r["set_gbps"]): r for r in document["paced"]}
    lead = (f"CPU process seconds per GB (all threads; the span over every unpaced cell's median) and paced "
            f"accuracy (achieved / set rate; {config['paced_mib']:g} MiB, {_size(min(config['chunks']))} chunks, "
            "frames), same run:")  # fmt: skip
    lines = [lead, "", *md.head(["", *(f"`{v}`" for v in variants)])]

    def spread(variant: str, key: str, mode: str | None = None) -> str:
        values = [r[key] for r in unpaced if r["variant"] == variant and mode in (None, r["mode"])]
        return _span(values)

    lines.append(md.line(["sender CPU s/GB", *(spread(v, "sender_cpu_s_per_gb") for v in variants)]))
    receiver = [f"{spread(v, 'receiver_cpu_s_per_gb', 'raw')} / {spread(v, 'receiver_cpu_s_per_gb', 'frames')}"
                for v in variants]  # fmt: skip
    lines.append(md.line(["receiver CPU s/GB, raw / frames", *receiver]))
    for rate in config["rates_gbps"]:
        accuracy = [_number(paced.get((v, rate), {}).get("ratio"), ".3f") for v in variants]
        lines.append(md.line([f"paced at {rate:g} Gbit/s", *accuracy]))
    return "\n".join([*lines, "", byte_costs_sentence(document)]) + "\n"


def byte_costs_sentence(document: dict) -> str:
    """What the receiver's per-byte work costs on one core, CPU seconds per GB (``byte_costs``)."""
    costs, config = document["byte_costs"], document["config"]
    mac = costs["blake2b_s_per_gb"]
    return (f"Per byte ({_size(config['cost_piece_bytes'])} pieces): the frame MAC (keyed BLAKE2b-128) "
            f"{mac:.3g} s/GB, {8 / mac:.1f} Gbit/s per core; a copy into a warm buffer "
            f"{costs['memcpy_warm_s_per_gb']:.3g} s/GB, out into new `bytes` {costs['copy_out_bytes_s_per_gb']:.3g} "
            f"s/GB, into a fresh {_size(config['cost_total_bytes'])} buffer (as `RequestAssembly` does: every page "
            f"touched first) {costs['copy_first_touch_s_per_gb']:.3g} s/GB.")  # fmt: skip


def _shown(config: dict) -> list[str]:
    return [v for v in SHOWN if v in config["variants"]]


def _setting(document: dict) -> str:
    """The run's date and commit, the machine's cores and its load at the end, the repeats."""
    config = document["config"]
    stamp = f"{document['date']}, commit {document['commit']}; " if document.get("date") else ""
    return (f"{stamp}{config['cpu_count']} cores, load average {config['loadavg_at_end'][0]:.1f} at the end; "
            f"{config['repeats']} repeats, variants round-robin")  # fmt: skip


def _size(nbytes: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if nbytes >= 1 << shift and nbytes % (1 << shift) == 0:
            return f"{nbytes >> shift} {unit}"
    return f"{nbytes:,} B"


def _span(values: list[float]) -> str:
    if not values:
        return NONE
    low, high = f"{min(values):.2f}", f"{max(values):.2f}"
    return low if low == high else f"{low}-{high}"


def _number(value: float | None, spec: str) -> str:
    return NONE if value is None else format(value, spec)
