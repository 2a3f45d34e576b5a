"""How fast a request decodes while another one arrives beside it, per mode, on the real prefill/decode pair.

For every mode a fresh deployment (the TTFT sweep's `deployment`: prefill +
decode with --lynx behind SGLang's router, frames of 10 ms on the link) is
started and answers one untimed warm-up request. Then, `--repeats` times, a
greedy request (`--long-prompt-tokens`, `--long-tokens` output tokens, EOS
ignored) streams through the router; once it has `--beside-after` tokens, a
second request (`--prompt-tokens`, `--max-tokens`) arrives. On a link slower
than the prefill makes KV the arriving request's KV streams while the first
one decodes, and in ``lynx`` mode it drafts on its anchor, its residual is
upgraded on the decode's data thread and its drafts are verified, all beside
the first request's decoding. The first request's token rate is measured in
three windows: before the arrival (from its 10th token), while the arriving
request is in flight (sent to answered) and after it.

    OMP_NUM_THREADS=1 python benchmark/decode_beside.py --modes int8,lynx --json docs/results/decode_beside.json
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time

import doc_markdown as md
from lynx_deploy.streaming import sse_events, stream_generate
from pair_modes import add_pair_options, run_modes, stamp
from ttft_sweep import deployment, request_body, warm_up

WINDOWS = ("before", "beside", "after")
FIRST_COUNTED = 10  # the long request's rate counts from this token: its own KV has landed by then


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_pair_options(parser, "decode_beside", modes="int8,lynx", link_gbps=0.02)
    parser.add_argument("--long-prompt-tokens", type=int, default=256)
    parser.add_argument("--long-tokens", type=int, default=240, help="output tokens of the decoding request")
    parser.add_argument("--beside-after", type=int, default=40, help="its token count when the second one is sent")
    parser.add_argument("--prompt-tokens", type=int, default=1024, help="prompt of the arriving request")
    parser.add_argument("--max-tokens", type=int, default=16, help="output tokens of the arriving request")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    if not FIRST_COUNTED < args.beside_after < args.long_tokens:
        parser.error(f"--beside-after must lie between {FIRST_COUNTED} and --long-tokens")
    return args


def rates(events: list[tuple[float, int]], sent: float, answered: float) -> dict[str, float]:
    """Tokens per second of a stream (``(seconds, tokens so far)`` per event) before `sent` (from its
    `FIRST_COUNTED`-th token), between `sent` and `answered`, and after `answered`."""
    def count_at(t: float) -> tuple[float, int]:
        return max(((s, n) for s, n in events if s <= t), default=(0.0, 0))

    start = next((s, n) for s, n in events if n >= FIRST_COUNTED)
    marks = [start, count_at(sent), count_at(answered), events[-1]]
    return {w: (b[1] - a[1]) / (b[0] - a[0]) if b[0] > a[0] else float("nan")
            for w, a, b in zip(WINDOWS, marks, marks[1:])}  # fmt: skip


def run_repeat(url: str, tokenizer, repeat: int, args) -> dict:
    """One long request with one arriving beside it: the long one's rates and the arriving one's run."""
    long_body = request_body(tokenizer, args.long_prompt_tokens, 500 + repeat, "greedy", args.long_tokens, seed=0)
    arriving_body = request_body(tokenizer, args.prompt_tokens, repeat, "greedy", args.max_tokens, seed=0)
    events: list[tuple[float, int]] = []
    arriving: dict = {}

    def arrive() -> None:
        arriving["sent"] = time.perf_counter() - start
        arriving["run"] = stream_generate(url, arriving_body, nth=(1,))
        arriving["answered"] = time.perf_counter() - start

    thread = threading.Thread(target=arrive)
    start = time.perf_counter()
    for event in sse_events(url, long_body):
        count = event.get("meta_info", {}).get("completion_tokens", 0)
        events.append((time.perf_counter() - start, count))
        if count >= args.beside_after and thread.ident is None:
            thread.start()
    thread.join()
    if events[-1][1] != args.long_tokens or "run" not in arriving:
        raise RuntimeError(f"repeat {repeat}: the long request gave {events[-1][1]} tokens, the arriving one "
                           f"{'answered' if 'run' in arriving else 'no answer'}")  # fmt: skip
    if arriving["answered"] >= events[-1][0]:
        raise RuntimeError(f"repeat {repeat}: the arriving request outlived the long one: raise --long-tokens")
    return {"rates": rates(events, arriving["sent"], arriving["answered"]), "sent_s": arriving["sent"],
            "answered_s": arriving["answered"], "long_s": events[-1][0],
            "arriving": {k: v for k, v in arriving["run"].items() if k != "text"}}  # fmt: skip


def run_mode(mode: str, model, tokenizer, args) -> dict:
    with deployment(model, mode, args.link_gbps, args.segment_tokens, "zmq", args) as pd:
        warm_up(f"{pd.url}/generate", tokenizer, ["greedy"])
        runs = []
        for repeat in range(args.repeats):
            pd.prefill.flush_cache()
            runs.append(run_repeat(f"{pd.url}/generate", tokenizer, repeat, args))
            r = runs[-1]["rates"]
            print(f"  {mode} repeat {repeat}: tokens/s " + ", ".join(f"{w} {r[w]:.2f}" for w in WINDOWS),
                  file=sys.stderr, flush=True)  # fmt: skip
    medians = {w: statistics.median(run["rates"][w] for run in runs) for w in WINDOWS}
    return {"mode": mode, "runs": runs, "median_rates": medians}


def main(argv=None) -> int:
    document = run_modes(parse_args(argv), run_mode)
    print(markdown(document))
    return 0


def _span(values: list[float]) -> str:
    return f"{min(values):.2f}-{max(values):.2f}"


def markdown(document: dict) -> str:
    """The docs' table (`scripts/doc_tables.py`): per mode the long request's tokens/s in each window
    (median, range over the repeats) and what the arriving request drafted and kept."""
    d, a = document, document["args"]
    lines = [f"{stamp(d)}: {a['link_gbps']:g} Gbit/s; a "
             f"{a['long_prompt_tokens']:,}-token request decoding {a['long_tokens']} tokens, a "
             f"{a['prompt_tokens']:,}-token one ({a['max_tokens']} tokens) sent at its token {a['beside_after']}; "
             f"{a['repeats']} repeats, tokens/s of the decoding request, median (range):", "",
             *md.head(["mode", *(f"{w} the arrival" if w != "beside" else "beside it" for w in WINDOWS),
                       "arrival in flight s", "arriving t1 s", "drafted (accepted)"])]  # fmt: skip
    for row in d["rows"]:
        runs = row["runs"]
        cells = [f"{row['median_rates'][w]:.2f} ({_span([r['rates'][w] for r in runs])})" for w in WINDOWS]
        flight = statistics.median(r["answered_s"] - r["sent_s"] for r in runs)
        t1 = statistics.median(r["arriving"]["ttft_s"] for r in runs)
        drafted = ", ".join(f"{r['arriving'].get('speculative_tokens', 0)} ({r['arriving'].get('accepted_tokens', 0)})"
                            for r in runs)  # fmt: skip
        lines.append(md.line([f"`{row['mode']}`", *cells, f"{flight:.2f}", f"{t1:.2f}", drafted]))
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
