"""docs/DEPLOY.md's "Measured" table, from the runs that `scripts/container_check.sh --json` records.

``markdown`` takes ``{"runs": [...]}`` (one record per run of the check, passed or failed, in the
order they ran) and returns a line on the runs' hosts and a ``| figure | value |`` table: how many
runs passed and why the others failed; the builds from an empty layer cache and the others; the
image's size; for the runs of separate containers, the seconds from starting them to the router
ready and to the first answer, the completion's seconds and its answer; one row per ``--compose``
run; and the ``meta_info["lynx"]`` of the latest completion that has one. Every value names the
date of its run. A figure no run measured has no row.

    python benchmark/container_report.py --from-json docs/results/container_check.json
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path

import doc_markdown as md

GB = 1e9
GIB = 1 << 30


def markdown(document: dict) -> str:
    """The lead line and the table of `document`'s runs (see the module docstring)."""
    runs = document["runs"]
    if not runs:
        raise ValueError("no runs recorded")
    apart = [r for r in runs if not r.get("compose")]
    rows = [("runs of the check", _outcomes(runs))]
    rows += [
        ("first build (empty layer cache, wheels from PyPI)",
         _per_date([r for r in runs if r.get("layer_cache_empty") is True], _key("build_s"), "s")),
        ("build with podman's layer cache kept",
         _per_date([r for r in runs if r.get("layer_cache_empty") is False], _key("build_s"), "s")),
        ("build, layer cache not known to be empty",
         _per_date([r for r in runs if r.get("layer_cache_empty") is None], _key("build_s"), "s")),
        ("image size (`podman image inspect`)", _distinct(runs, _size)),
        ("containers started to router ready", _per_date(apart, _key("router_ready_s"), "s")),
        ("chat completion through the router, once ready", _per_date(apart, _answer_seconds, "s")),
        ("containers started to the first answer", _per_date(apart, _key("first_answer_s"), "s")),
        ("answer (greedy, 48 tokens at most)", _distinct(apart, _answer)),
    ]  # fmt: skip
    rows += [(_compose_label(r), _compose_value(r)) for r in runs if r.get("compose")]
    metered = [r for r in runs if (r.get("completion") or {}).get("lynx")]
    if metered:
        last = metered[-1]
        where = ", `--compose`" if last.get("compose") else ""
        rows.append((f'`meta_info["lynx"]` of the last completion ({last["date"]}{where})',
                     _lynx(last["completion"]["lynx"])))  # fmt: skip
    lines = [_hosts(runs), "", *md.table(["figure", "value"], [(figure, value) for figure, value in rows if value])]
    return "\n".join(lines) + "\n"


def _key(name: str) -> Callable[[dict], object]:
    return lambda run: run.get(name)


def _answer_seconds(run: dict) -> str | None:
    seconds = (run.get("completion") or {}).get("answer_s")
    return None if seconds is None else f"{seconds:.1f}"


def _answer(run: dict) -> str | None:
    text = (run.get("completion") or {}).get("answer")
    return None if text is None else json.dumps(text, ensure_ascii=False).replace("|", "\\|")


def _size(run: dict) -> str | None:
    size = run.get("image_bytes")
    return None if size is None else f"{size / GB:.2f} GB"


def _join(items: list[str]) -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _per_date(runs: list[dict], value: Callable[[dict], object], unit: str) -> str:
    """Every run's value, grouped by date: ``176, 182 and 245 s on 2026-12-04; 142 s on 2026-12-05``."""
    dates: dict[str, list[str]] = {}
    for run in runs:
        figure = value(run)
        if figure is not None:
            dates.setdefault(run["date"], []).append(str(figure))
    return "; ".join(f"{_join(values)} {unit} on {date}" for date, values in dates.items())


def _distinct(runs: list[dict], value: Callable[[dict], str | None]) -> str:
    """Each distinct value with the dates of the runs that gave it: ``11.43 GB (2026-12-04 and 2026-12-05)``."""
    seen: dict[str, list[str]] = {}
    for run in runs:
        figure = value(run)
        if figure is not None and run["date"] not in seen.setdefault(figure, []):
            seen[figure].append(run["date"])
    return "; ".join(f"{figure} ({_join(dates)})" for figure, dates in seen.items() if dates)


def _outcomes(runs: list[dict]) -> str:
    passed = sum(bool(r.get("passed")) for r in runs)
    first, last = runs[0]["date"], runs[-1]["date"]
    text = f"{len(runs)} " + (f"on {first}" if first == last else f"from {first} to {last}") + f", {passed} passed"
    failed = [f"{r.get('failure') or 'no reason recorded'} ({r['date']})" for r in runs if not r.get("passed")]
    return text + (f"; failed: {'; '.join(failed)}" if failed else "")


def _compose_label(run: dict) -> str:
    version = f" (podman-compose {run['podman_compose']})" if run.get("podman_compose") else ""
    return f"`--compose`, {run['date']}{version}"


def _compose_value(run: dict) -> str:
    """``passed, 360 s in all: build 9 s (layer cache kept), router ready 338 s after `up`, answer in 1.3 s``."""
    outcome = "passed" if run.get("passed") else f"failed ({run.get('failure') or 'no reason recorded'})"
    if run.get("total_s") is not None:
        outcome += f", {run['total_s']} s in all"
    parts = []
    if run.get("build_s") is not None:
        cache = {True: "empty layer cache", False: "layer cache kept"}.get(run.get("layer_cache_empty"))
        parts.append(f"build {run['build_s']} s" + (f" ({cache})" if cache else ""))
    if run.get("router_ready_s") is not None:
        parts.append(f"router ready {run['router_ready_s']} s after `up`")
    if _answer_seconds(run) is not None:
        parts.append(f"answer in {_answer_seconds(run)} s")
    return outcome + (": " + ", ".join(parts) if parts else "")


def _lynx(metrics: dict) -> str:
    """``mode `lynx`, 42 tokens, prefill announced at 0.065 s, anchor landed at 0.35 s, residual 0.06 ms later``."""
    parts = [f"mode `{metrics.get('mode')}`"]
    if metrics.get("transferred_tokens") is not None:
        parts.append(f"{metrics['transferred_tokens']} tokens")
    if metrics.get("manifest_s") is not None:
        parts.append(f"prefill announced at {metrics['manifest_s']:.2g} s")
    anchor, residual = metrics.get("anchor_ready_s"), metrics.get("residual_ready_s")
    if anchor is not None:
        parts.append(f"anchor landed at {anchor:.2g} s")
    if anchor is not None and residual is not None:
        parts.append(f"residual {(residual - anchor) * 1e3:.2g} ms later")
    if metrics.get("speculative_tokens"):
        parts.append(f"{metrics['speculative_tokens']} tokens drafted, {metrics.get('accepted_tokens', 0)} kept")
    return ", ".join(parts)


def _hosts(runs: list[dict]) -> str:
    """One line: each distinct host and podman version, the commits, and the load average at the runs' ends."""
    hosts = []
    for run in runs:
        host = run.get("host") or {}
        memory = f", {host['memory_bytes'] / GIB:.0f} GiB RAM" if host.get("memory_bytes") else ""
        text = f"{host.get('cpus')} cores ({host.get('cpu_model') or 'CPU unknown'}){memory}"
        text += f", podman {run.get('podman') or 'unknown'}"
        if text not in hosts:
            hosts.append(text)
    commits = list(dict.fromkeys(r["commit"] for r in runs if r.get("commit")))
    loads = [r["host"]["load_average"][2] for r in runs if (r.get("host") or {}).get("load_average")]
    line = f"{len(runs)} run{'s' * (len(runs) > 1)} of `scripts/container_check.sh --json` on {'; '.join(hosts)}"
    if commits:
        line += f"; commit{'s' * (len(commits) > 1)} {', '.join(commits)}"
    if loads:
        span = f"{min(loads):g}" + (f"-{max(loads):g}" if max(loads) > min(loads) else "")
        line += f"; 15-minute load average at the end {span}"
    return line + ":"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--from-json", type=Path, required=True,
                        help="the JSON that scripts/container_check.sh --json appends to")
    args = parser.parse_args(argv)
    print(markdown(json.loads(args.from_json.read_text())), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
