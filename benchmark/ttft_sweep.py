"""TTFT of the real prefill/decode pair per mode, emulated link rate and prompt length.

For every (mode, link rate) a fresh deployment (prefill + decode with --lynx
and SGLang's router) is started; every prompt length is sent `--repeats`
times (distinct essay text each time, prefill cache flushed) as a streaming
`/generate` through the router. Recorded per request: client-side time to the
first streamed token and to the N-th, and the decode server's anchor and
residual arrival times (`meta_info["lynx"]`).

The link is emulated by the prefill sender's token bucket (`--lynx-link-gbps`).
A 135M model on two CPU cores prefills 2k tokens in about 11 s, far slower
than an 8B model on a GPU, so the link rates are scaled down to keep the ratio
of transfer time to prefill time in the range of real clusters; the table
states that ratio per row (docs/BENCHMARKS.md).

    python benchmark/ttft_sweep.py --modes bf16,int8,int4,lynx --link-gbps 0.02,0.05,0.2 --prompt-tokens 1024,2048
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from lynx.kvwire import KVShape, WireFormat
from lynx.models import prepare_smollm2
from lynx_testing.deploy import PDDeployment
from lynx_testing.launch import CPU_MODEL_ARGS
from lynx_testing.prompts import chat_prompt, long_question
from lynx_testing.streaming import stream_generate

SMOLLM2 = dict(num_layers=30, kv_heads=3, head_dim=64)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--modes", default="bf16,int8,int4,lynx")
    parser.add_argument("--link-gbps", default="0.02,0.05,0.2", help="emulated link rates, Gbit/s")
    parser.add_argument("--prompt-tokens", default="1024,2048")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--nth", default="1,8,32", help="report time to these output tokens")
    parser.add_argument("--json", default="results/ttft_sweep.json")
    parser.add_argument("--log-dir", default="results/ttft_logs")
    return parser.parse_args(argv)


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def run_point(pd: PDDeployment, tokenizer, tokens: int, repeat: int, args) -> dict:
    pd.prefill.flush_cache()
    text = chat_prompt(tokenizer, long_question(tokenizer, tokens, index=repeat + 7 * tokens))
    body = {"text": text, "sampling_params": {"max_new_tokens": args.max_tokens, "temperature": 0}}
    return stream_generate(f"{pd.url}/generate", body, nth=_ints(args.nth))


def main(argv=None) -> int:
    from transformers import AutoTokenizer

    args = parse_args(argv)
    model = prepare_smollm2()
    tokenizer = AutoTokenizer.from_pretrained(str(model))
    rows = []
    points = [(m, float(r)) for m in args.modes.split(",") for r in args.link_gbps.split(",")]
    for done, (mode, rate) in enumerate(points, start=1):
        print(f"[{done}/{len(points)}] mode={mode} link={rate} Gbps: starting deployment", file=sys.stderr, flush=True)
        lynx_args = ["--lynx-mode", mode, "--lynx-link-gbps", str(rate), "--lynx-insecure"]
        log_dir = Path(args.log_dir) / f"{mode}-{rate}"
        with PDDeployment(model, lynx_args, extra_args=CPU_MODEL_ARGS, log_dir=log_dir, max_total_tokens=32768) as pd:
            for tokens in _ints(args.prompt_tokens):
                runs = [run_point(pd, tokenizer, tokens, r, args) for r in range(args.repeats)]
                rows.append(summarize(mode, rate, tokens, runs))
                print(f"    {tokens} tokens: TTFT {rows[-1]['ttft_s']:.2f}s", file=sys.stderr, flush=True)
    add_ratios(rows)
    print_table(rows)
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps({"args": vars(args), "rows": rows}, indent=2))
    print(f"\nJSON: {args.json}")
    return 0


def summarize(mode: str, rate: float, tokens: int, runs: list[dict]) -> dict:
    def median(key):
        values = [r[key] for r in runs if r.get(key) is not None]
        return statistics.median(values) if values else None

    prompt_tokens = runs[0]["prompt_tokens"]
    shape = KVShape(SMOLLM2["num_layers"], prompt_tokens, SMOLLM2["kv_heads"], SMOLLM2["head_dim"], _bf16())
    stream_bytes = WireFormat.for_mode(mode, "int8").stream_sizes(shape)
    nth_keys = _nth_keys(runs)
    return {
        "mode": mode,
        "link_gbps": rate,
        "prompt_tokens": prompt_tokens,
        "stream_bytes": list(stream_bytes),
        "ttft_s": median("ttft_s"),
        **{k: median(k) for k in nth_keys if k != "ttft_s"},
        "anchor_ready_s": median("anchor_ready_s"),
        "residual_ready_s": median("residual_ready_s"),
        "manifest_s": median("manifest_s"),
        **_speculation(runs),
        "repeats": len(runs),
    }


def _speculation(runs: list[dict]) -> dict:
    """Lynx mode: held-back tokens, how many verify accepted, rollbacks (totals over the repeats)."""
    if not any("speculative_tokens" in r for r in runs):
        return {}
    spec = sum(r.get("speculative_tokens", 0) for r in runs)
    accepted = sum(r.get("accepted_tokens", 0) for r in runs)
    return {
        "speculative_tokens": spec,
        "accepted_tokens": accepted,
        "acceptance": accepted / spec if spec else None,
        "rollbacks": sum(r.get("rollbacks", 0) for r in runs),
    }


def add_ratios(rows: list[dict]) -> None:
    """TTFT relative to bf16 at the same point; transfer time of bf16 KV relative to prefill time."""
    bf16 = {(r["link_gbps"], r["prompt_tokens"]): r for r in rows if r["mode"] == "bf16"}
    for row in rows:
        base = bf16.get((row["link_gbps"], row["prompt_tokens"]))
        row["ttft_vs_bf16"] = row["ttft_s"] / base["ttft_s"] if base and base["ttft_s"] else None
        bf16_bytes = 2 * 2 * row["prompt_tokens"] * SMOLLM2["num_layers"] * SMOLLM2["kv_heads"] * SMOLLM2["head_dim"]
        transfer_s = bf16_bytes * 8 / (row["link_gbps"] * 1e9)
        prefill_s = base["manifest_s"] if base else None
        row["bf16_transfer_to_prefill"] = transfer_s / prefill_s if prefill_s else None


def print_table(rows: list[dict]) -> None:
    def fmt(value, spec=".2f"):
        return "-" if value is None else format(value, spec)

    header = (
        f"{'mode':6} {'Gbps':>6} {'tokens':>6} {'xfer/prefill':>12} {'TTFT s':>7} {'vs bf16':>7} "
        f"{'anchor s':>8} {'resid s':>8} {'accept':>6} {'rollbk':>6}"
    )
    extra = _nth_keys(rows)
    print(header + "".join(f" {k:>8}" for k in extra))
    for r in rows:
        line = (
            f"{r['mode']:6} {r['link_gbps']:>6g} {r['prompt_tokens']:>6} {fmt(r['bf16_transfer_to_prefill']):>12} "
            f"{fmt(r['ttft_s']):>7} {fmt(r['ttft_vs_bf16']):>7} {fmt(r['anchor_ready_s']):>8} {fmt(r['residual_ready_s']):>8} "
            f"{fmt(r.get('acceptance')):>6} {fmt(r.get('rollbacks'), 'd'):>6}"
        )
        print(line + "".join(f" {fmt(r.get(k)):>8}" for k in extra))


def _nth_keys(records: list[dict]) -> list[str]:
    """The ``t{n}_s`` keys (time to the n-th token) present in `records`, by n."""
    keys = {k for r in records for k in r if k.startswith("t") and k.endswith("_s") and k[1:-2].isdigit()}
    return sorted(keys, key=lambda k: int(k[1:-2]))


def _bf16():
    import torch

    return torch.bfloat16


if __name__ == "__main__":
    sys.exit(main())
