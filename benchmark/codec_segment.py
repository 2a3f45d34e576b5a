"""One segment as the servers move it: `WireFormat.encode`, `write` and `upgrade` per mode, on this CPU.

A segment is ``--tokens`` tokens of every layer of SmolLM2-135M (30 layers,
3 KV heads of 64, bf16), read from per-layer pools at a random permutation of
slots, as the prefill's encoder thread reads a segment the forward has stored;
the decode side writes the anchor (``write`` with the first stream) and, in
``lynx`` mode, upgrades the slots once the residual is there (``upgrade``).
Medians of ``--repeats`` runs after one warm-up; the JSON feeds the sentence
in docs/CODEC.md (`scripts/doc_tables.py`, renderer ``codec_segment``).

    OMP_NUM_THREADS=1 python benchmark/codec_segment.py --json docs/results/codec_segment.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
from pathlib import Path

import doc_markdown as md
import torch
from codec_throughput import time_op
from lynx.kvwire import KVShape, WireFormat
from lynx_deploy.models import SMOLLM2
from lynx_testing import provenance

MODES = ("int8", "int4", "lynx")
PRESET = "int8"  # the default --lynx-preset: lynx's 4-bit anchor + 4-bit residual
OP_NAMES = {"encode": "encode", "write anchor": "write the first stream (`lynx`'s anchor, the others' whole KV)",
            "upgrade": "upgrade"}  # fmt: skip


def plan(tokens: int, seed: int) -> list[tuple[str, str, object]]:
    """``(op, mode, fn)`` of every measurement."""
    generator = torch.Generator().manual_seed(seed)
    layers, heads, dim = SMOLLM2.num_layers, SMOLLM2.kv_heads, SMOLLM2.head_dim
    pool_size = 2 * tokens

    def pools():
        return [torch.randn(pool_size, heads, dim, generator=generator).to(torch.bfloat16) for _ in range(layers)]

    k_pools, v_pools, k_out, v_out = pools(), pools(), pools(), pools()
    slots = torch.randperm(pool_size, generator=generator)[:tokens]
    shape = KVShape(layers, tokens, heads, dim, torch.bfloat16)
    ops = []
    for mode in MODES:
        wire = WireFormat.for_mode(mode, PRESET)
        streams = wire.encode(k_pools, v_pools, slots)
        ops.append(("encode", mode, lambda w=wire: w.encode(k_pools, v_pools, slots)))
        ops.append(("write anchor", mode, lambda w=wire, s=streams: w.write(s[:1], shape, k_out, v_out, slots)))
        if wire.num_streams > 1:
            ops.append(("upgrade", mode, lambda w=wire, s=streams: w.upgrade(s, shape, k_out, v_out, slots)))
    return ops


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=512, help="tokens of the segment (default 512, the server's)")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.tokens < 1 or args.repeats < 1:
        parser.error("--tokens and --repeats must be >= 1")
    rows = []
    for op, mode, fn in plan(args.tokens, args.seed):
        median = statistics.median(time_op(fn, 1, args.repeats))
        rows.append({"op": op, "mode": mode, "median_s": median})
        print(f"{op:<13} {mode:<5} {median * 1e3:8.1f} ms", file=sys.stderr, flush=True)
    result = {"date": datetime.date.today().isoformat(), "commit": provenance.commit(Path(__file__).parent),
              "threads": torch.get_num_threads(), "cpus": os.cpu_count(), "tokens": args.tokens,
              "layers": SMOLLM2.num_layers, "kv_heads": SMOLLM2.kv_heads, "head_dim": SMOLLM2.head_dim,
              "preset": PRESET, "repeats": args.repeats, "rows": rows}  # fmt: skip
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=1))
    print(sentence(result))
    return 0


def sentence(result: dict) -> str:
    """The docs' sentence: per mode, the milliseconds of each op on one segment."""
    by_op: dict[str, list[str]] = {}
    for row in result["rows"]:
        by_op.setdefault(row["op"], []).append(f"`{row['mode']}` {row['median_s'] * 1e3:.0f}")
    ops = "; ".join(f"{OP_NAMES[op]} {', '.join(cells)}" for op, cells in by_op.items())
    return (f"One {result['tokens']}-token SmolLM2 segment of {result['layers']} layers as the servers move it "
            f"(`WireFormat`, slots in random order, {md.count(result['threads'], 'thread')}, "
            f"medians of {result['repeats']}; "
            f"{result['date']}, commit {result['commit']}), ms: {ops}.\n")


if __name__ == "__main__":
    sys.exit(main())
