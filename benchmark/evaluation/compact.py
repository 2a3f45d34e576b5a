"""The evaluation's results in small, to commit beside the docs: every figure, none of the tokens.

A run's `results.json` keeps what the item-for-item judge needs: each task
item's prompt and output token ids with their top-2 log-probabilities, and
each speed request's tokens and top log-probabilities. The compact form has
the same layout without those (`HEAVY`), without tracebacks and without the
cluster-scale table (an estimate this checkout recomputes; its ratios stay),
each failure cut to its first line, and each model's table label: the
summaries, every speed row with its requests' timings, every item's score and
answer text, every judged comparison with its partings, and every held-out
window's scores. `claims.claims` and `doc_tables` read it as they read the
full results.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

KIND = "evaluation-compact"
HEAVY = frozenset({"prompt_ids", "output_ids", "top2", "tops", "traceback"})
ERROR_CHARS = 300


def compact(results: dict, labels: Mapping[str, str]) -> dict:
    """`results` (as `evaluate.py` writes it) without its heavy parts; `labels`: model -> table label,
    for plans recorded before plans carried one."""
    out = _lean({k: v for k, v in results.items() if k not in ("models", "plans", "cluster")})
    out["kind"] = KIND
    out["plans"] = {m: {**p, "label": p.get("label") or labels.get(m, m)} for m, p in results["plans"].items()}
    out["models"] = {m: _model(data) for m, data in results["models"].items()}
    cluster = results.get("cluster", {})
    out["cluster"] = {k: cluster[k] for k in ("assumptions", "ratios") if k in cluster}
    return out


def write(results: dict, labels: Mapping[str, str], path: Path) -> int:
    """`compact(results, labels)` written to `path` as one line of JSON (like the other committed results);
    returns its size in bytes."""
    text = json.dumps(compact(results, labels), separators=(",", ":"), default=str) + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return len(text.encode())


def _model(data: dict) -> dict:
    out = _lean(data)
    for record in out["variants"].values():
        if "error" in record:
            record["error"] = _first_line(record["error"])
    if "error" in out.get("likelihood", {}):
        out["likelihood"]["error"] = _first_line(out["likelihood"]["error"])
    return out


def _first_line(text: str) -> str:
    return (text.splitlines() or [""])[0][:ERROR_CHARS]


def _lean(value):
    """`value` with every key in `HEAVY` left out, at any depth."""
    if isinstance(value, dict):
        return {k: _lean(v) for k, v in value.items() if k not in HEAVY}
    if isinstance(value, (list, tuple)):
        return [_lean(v) for v in value]
    return value
