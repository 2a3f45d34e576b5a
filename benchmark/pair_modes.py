"""What the small one-pair-per-mode benchmarks share (`pair_cpu`, `decode_beside`, `cached_prefix`):
their deployment options and the run over the modes into one JSON document."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

from lynx_deploy.models import prepare_smollm2
from lynx_testing import provenance

LOCAL_ARGS = ("log_dir", "side_by_side")  # where this machine kept its logs; not in the JSON


def add_pair_options(parser: argparse.ArgumentParser, name: str, modes: str, link_gbps: float) -> None:
    """The options of every such benchmark: its modes, the pair's link and chunking, where it writes."""
    parser.add_argument("--modes", default=modes, help="comma-separated --lynx-mode values, one pair each")
    parser.add_argument("--link-gbps", type=float, default=link_gbps, help="the prefill's emulated link, Gbit/s")
    parser.add_argument("--segment-tokens", type=int, default=512, help="--lynx-segment-tokens (0 = the KV whole)")
    parser.add_argument("--chunk-ms", type=float, default=10.0, help="frame size as time on the link (ttft_sweep.py)")
    parser.add_argument("--chunked-prefill-size", type=int, default=512)
    parser.add_argument("--json", default=f"results/{name}.json")
    parser.add_argument("--log-dir", default=f"results/{name}_logs")
    parser.set_defaults(side_by_side=False)  # one pair at a time: `ttft_sweep.deployment` reads it


def run_modes(args: argparse.Namespace, run_mode: Callable) -> dict:
    """`run_mode(mode, model, tokenizer, args)` for each of `args.modes`, one row each, written to
    `args.json` with the date, commit, wall time and arguments; returns the document."""
    from transformers import AutoTokenizer

    started = time.time()
    model = prepare_smollm2()
    tokenizer = AutoTokenizer.from_pretrained(str(model))
    rows = []
    for mode in [m for m in args.modes.split(",") if m]:
        print(f"{mode}: starting the pair", file=sys.stderr, flush=True)
        rows.append(run_mode(mode, model, tokenizer, args))
    document = {"date": time.strftime("%Y-%m-%d"), "commit": provenance.commit(Path(__file__).parent),
                "wall_s": round(time.time() - started),
                "args": {k: v for k, v in vars(args).items() if k not in LOCAL_ARGS}, "rows": rows}  # fmt: skip
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(document, indent=1) + "\n")
    return document


def stamp(document: dict) -> str:
    """``2026-12-07, commit abc1234, 7 min``: the start of each table's caption."""
    return f"{document['date']}, commit {document['commit']}, {round(document['wall_s'] / 60)} min"
