"""A prompt whose start the prefill server holds cached, against the same prompt computed whole, on the real pair.

For every mode a fresh deployment (the TTFT sweep's `deployment`: prefill +
decode with --lynx behind SGLang's router) is started and answers one untimed
warm-up request. Then, for each of `--repeats` prompts (`--prompt-tokens`,
greedy), two variants, which of them first alternating, each after the
prefill's cache is flushed:

* ``whole``: the prompt is sent straight to both servers (bootstrap fields);
* ``cached``: first an untimed request whose user turn is the prompt's first
  `--cached-tokens` tokens of essay text goes through the router (the prefill
  server's radix cache keeps them), then the same prompt as in ``whole``.

The prefill computes only the uncached rest, but the decode server must
still receive the KV of every prompt token: recorded per request are the
prefill's cached token count (its answer's ``cached_tokens``), the tokens the
decode received (``transferred_tokens``), when its anchor and residual were
ready, the prefill's own time and the first token; both variants' outputs of
a prompt are compared token for token.

    OMP_NUM_THREADS=1 python benchmark/cached_prefix.py --modes lynx --json docs/results/cached_prefix.json
"""

from __future__ import annotations

import argparse
import statistics
import sys

import doc_markdown as md
from lynx_deploy.deployment import new_room
from lynx_deploy.processes import post_json
from lynx_testing.prompts import chat_prompt, essay_excerpt
from pair_modes import add_pair_options, run_modes, stamp
from ttft_outputs import kept, stream_direct_recorded
from ttft_sweep import deployment, request_body, warm_up

VARIANTS = ("whole", "cached")
WARM = {"max_new_tokens": 1, "temperature": 0}  # the request that leaves the shared start cached
FIELDS = ("prefill_cached_tokens", "transferred_tokens", "prefill_s", "anchor_ready_s", "residual_ready_s", "ttft_s")


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_pair_options(parser, "cached_prefix", modes="lynx", link_gbps=0.02)
    parser.add_argument("--prompt-tokens", type=int, default=1024)
    parser.add_argument("--cached-tokens", type=int, default=512, help="essay tokens the cached variant shares")
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=8)
    args = parser.parse_args(argv)
    if not 0 < args.cached_tokens < args.prompt_tokens:
        parser.error("--cached-tokens must lie between 0 and --prompt-tokens")
    return args


def run_mode(mode: str, model, tokenizer, args) -> dict:
    """Both variants of every prompt on `mode`'s pair; its row (runs per variant, in order)."""
    runs = {variant: [] for variant in VARIANTS}
    with deployment(model, mode, args.link_gbps, args.segment_tokens, "zmq", args) as pd:
        warm_up(f"{pd.url}/generate", tokenizer, ["greedy"])
        for repeat in range(args.repeats):
            body = request_body(tokenizer, args.prompt_tokens, repeat, "greedy", args.max_tokens, seed=0)
            shared = chat_prompt(tokenizer, essay_excerpt(tokenizer, args.cached_tokens, repeat))
            for variant in VARIANTS[repeat % 2:] + VARIANTS[:repeat % 2]:
                pd.prefill.flush_cache()
                if variant == "cached":
                    post_json(f"{pd.url}/generate", {"text": shared, "sampling_params": WARM})
                run = kept(stream_direct_recorded(pd, body, new_room()))
                runs[variant].append(run | {"repeat": repeat})
                print(f"  {mode} repeat {repeat} {variant}: cached {run['prefill_cached_tokens']}, t1 "
                      f"{run['ttft_s']:.2f}s", file=sys.stderr, flush=True)  # fmt: skip
    pairs = list(zip(runs["whole"], runs["cached"]))
    return {"mode": mode, "runs": runs,
            "medians": {v: {f: statistics.median(r[f] for r in rs if r.get(f) is not None) for f in FIELDS
                            if any(r.get(f) is not None for r in rs)} for v, rs in runs.items()},
            "same_tokens": sum(a["output_ids"] == b["output_ids"] for a, b in pairs), "prompts": len(pairs),
            "every_token_sent": all(r["transferred_tokens"] == r["prompt_tokens"]
                                    for rs in runs.values() for r in rs if "transferred_tokens" in r)}  # fmt: skip


def main(argv=None) -> int:
    document = run_modes(parse_args(argv), run_mode)
    print(markdown(document))
    rows = document["rows"]
    cached_used = all(r["medians"]["cached"].get("prefill_cached_tokens", 0) > 0 for r in rows)
    return 0 if cached_used and all(r["every_token_sent"] for r in rows) else 1


def markdown(document: dict) -> str:
    """The docs' table (`scripts/doc_tables.py`): per mode and variant the medians of `FIELDS`, then
    whether the decode received every prompt token and how many prompts gave the same tokens."""
    d, a = document, document["args"]
    lines = [f"{stamp(d)}: {a['link_gbps']:g} Gbit/s, "
             f"{a['prompt_tokens']:,}-token prompts, the cached variant's first {a['cached_tokens']} essay tokens "
             f"computed before; {a['repeats']} prompts, medians:", "",
             *md.head(["mode", "variant", "prefill cached tokens", "tokens sent", "prefill s", "anchor ready s",
                       "residual ready s", "t1 s"])]  # fmt: skip
    for row in d["rows"]:
        for variant, m in row["medians"].items():
            cells = [f"{m[f]:.0f}" if f in m and f.endswith("tokens") else f"{m[f]:.2f}" if f in m else "-"
                     for f in FIELDS]  # fmt: skip
            lines.append(md.line([f"`{row['mode']}`", variant, *cells]))
    same = "; ".join(f"`{r['mode']}`: every prompt token's KV sent in "
                     f"{'every' if r['every_token_sent'] else 'not every'} request, the same tokens in both "
                     f"variants for {r['same_tokens']} of {r['prompts']} prompts" for r in d["rows"])  # fmt: skip
    lines += ["", same + "."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
