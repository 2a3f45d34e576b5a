"""Rebuild every generated block of the docs from its committed JSON, or check that they agree.

    python scripts/doc_tables.py            # rewrite the blocks in place
    python scripts/doc_tables.py --check    # exit 1 and show the first difference if a block is stale

A generated block in a Markdown file reads

    <!-- generated: RENDERER JSON -->
    ...
    <!-- end generated -->

where RENDERER names a function in `RENDERERS` (a benchmark's own `--from-json`
rendering) and JSON a committed result, relative to the repository root.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"(<!-- generated: (\S+) (\S+) -->\n)(.*?)(<!-- end generated -->)", re.S)
# Renderer name -> (module under benchmark/, function taking the parsed JSON, returning Markdown).
RENDERERS = {
    "serving_load": ("load.report", "markdown"),
    "serving_load_idle": ("load.report", "idle_link_bound_line"),
    "fault_load": ("faults.report", "markdown"),
    "fault_matrix": ("faults.report", "matrix_markdown"),
    "idle_cpu": ("idle_cpu", "markdown"),
    "pair_cpu": ("pair_cpu", "markdown"),
    "decode_beside": ("decode_beside", "markdown"),
    "cached_prefix": ("cached_prefix", "markdown"),
    "container_check": ("container_report", "markdown"),
    "pd_failures": ("faults.report", "single_markdown"),
    "pd_soak": ("faults.report", "pd_soak_markdown"),
    "ttft_sweep": ("ttft_verdicts", "markdown"),
    "codec_bytes": ("codec_report", "bytes_markdown"),
    "codec_quality": ("codec_report", "quality_markdown"),
    "codec_anchor_designs": ("codec_report", "anchor_markdown"),
    "codec_residual_designs": ("codec_report", "residual_markdown"),
    "codec_throughput": ("codec_speed_report", "throughput_markdown"),
    "codec_segment": ("codec_segment", "sentence"),
    "codec_throughput_ms": ("codec_speed_report", "throughput_ms_markdown"),
    "gpu_bandwidth": ("codec_speed_report", "gpu_bandwidth_markdown"),
    "gpu_bandwidth_sentence": ("codec_speed_report", "gpu_bandwidth_sentence"),
    "transport_throughput": ("transport_report", "throughput_markdown"),
    "transport_cpu": ("transport_report", "cpu_markdown"),
    "ttft_transports": ("ttft_tables", "transports_markdown"),
    "ttft_pipelining": ("ttft_tables", "pipelining_markdown"),
    "ttft_verify": ("ttft_tables", "verify_markdown"),
    "evaluation_run": ("evaluation.doc_tables", "run_line"),
    "evaluation_claims": ("evaluation.doc_tables", "claims_markdown"),
    "evaluation_accuracy": ("evaluation.doc_tables", "accuracy_markdown"),
    "evaluation_likelihood": ("evaluation.doc_tables", "likelihood_markdown"),
    "evaluation_speed": ("evaluation.doc_tables", "speed_markdown"),
    "evaluation_timings": ("evaluation.doc_tables", "timings_markdown"),
}


def render(name: str, json_path: str) -> str:
    if name not in RENDERERS:
        raise SystemExit(f"unknown renderer {name!r}; known: {', '.join(sorted(RENDERERS))}")
    module, function = RENDERERS[name]
    if str(ROOT / "benchmark") not in sys.path:
        sys.path.insert(0, str(ROOT / "benchmark"))
    data = json.loads((ROOT / json_path).read_text())
    return getattr(importlib.import_module(module), function)(data).rstrip("\n") + "\n"


def rebuilt(text: str) -> str:
    return BLOCK.sub(lambda m: m.group(1) + render(m.group(2), m.group(3)) + m.group(5), text)


def blocks(text: str) -> list[tuple[str, str]]:
    return [(m.group(2), m.group(3)) for m in BLOCK.finditer(text)]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only check; exit 1 on a stale block")
    args = parser.parse_args(argv)
    stale = 0
    for doc in DOCS:
        text = doc.read_text()
        new = rebuilt(text)
        if new == text:
            continue
        stale += 1
        if args.check:
            diff = difflib.unified_diff(text.splitlines(), new.splitlines(), str(doc.relative_to(ROOT)), "rebuilt", lineterm="")
            print("\n".join(list(diff)[:40]))
        else:
            doc.write_text(new)
            print(f"rebuilt {doc.relative_to(ROOT)}")
    if args.check and stale:
        print(f"{stale} doc(s) disagree with their JSON; run python scripts/doc_tables.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
