"""Where a prefill/decode pair's CPU goes per request, and what the router adds: one pair per mode,
each request sent once through SGLang's router and once straight to both servers.

For every mode a fresh deployment (prefill + decode with --lynx and SGLang's
router, the TTFT sweep's `deployment`) is started and answers one untimed
warm-up request. Then, for each of `--repeats` prompts (distinct essay text,
greedy, prefill cache flushed before each request), the same request goes
through the router and straight to both servers (bootstrap fields, no router),
which of the two first alternating. Around every request the CPU seconds
(user + system) of each process are read:

* ``router``: the router's process tree;
* ``prefill main`` / ``decode main``: the scheduler's main thread (SGLang's
  event loop: forward passes, and in ``lynx`` mode the decode's verify);
* ``prefill threads`` / ``decode threads``: every other thread of the
  scheduler (Lynx's encoder, sender and decode data threads, ZeroMQ's I/O
  threads, SGLang's helpers);
* ``prefill rest`` / ``decode rest``: the server's other processes
  (tokenizer/HTTP, detokenizer).

Per request the client also records the time to the first and the
`--max-tokens`-th token. Both routes' outputs of a request must be the same
tokens (checked; the exit code says so). The JSON feeds a table in
docs/BENCHMARKS.md (`scripts/doc_tables.py`, renderer ``pair_cpu``).

    OMP_NUM_THREADS=1 python benchmark/pair_cpu.py --modes int4,lynx --json docs/results/pair_cpu.json
"""

from __future__ import annotations

import argparse
import statistics
import sys

import doc_markdown as md
import psutil
from idle_cpu import cpu_seconds
from lynx_deploy.deployment import PDDeployment, new_room
from lynx_deploy.processes import process_tree
from pair_modes import add_pair_options, run_modes, stamp
from ttft_outputs import kept, stream_direct_recorded, stream_recorded
from ttft_sweep import deployment, request_body, warm_up

PARTS = ("router", "prefill main", "prefill threads", "prefill rest", "decode main", "decode threads", "decode rest")
ROUTES = ("router", "direct")


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_pair_options(parser, "pair_cpu", modes="int4,lynx", link_gbps=0.1)
    parser.add_argument("--prompt-tokens", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=6, help="prompts per mode, each sent by both routes")
    parser.add_argument("--max-tokens", type=int, default=16)
    return parser.parse_args(argv)


class CpuMeter:
    """Reads the CPU seconds of every part (`PARTS`) of one running deployment."""

    def __init__(self, pd: PDDeployment) -> None:
        self._router = process_tree(pd.router.pid)
        self._servers = {}
        for side, server in (("prefill", pd.prefill), ("decode", pd.decode)):
            (scheduler,) = server.scheduler_pids()
            self._servers[side] = (psutil.Process(scheduler), process_tree(server.process.pid))

    def read(self) -> dict[str, float]:
        out = {"router": cpu_seconds(self._router)}
        for side, (scheduler, tree) in self._servers.items():
            threads = scheduler.threads()
            main = sum(t.user_time + t.system_time for t in threads if t.id == scheduler.pid)
            every = sum(t.user_time + t.system_time for t in threads)
            out |= {f"{side} main": main, f"{side} threads": every - main,
                    f"{side} rest": cpu_seconds(tree) - cpu_seconds([scheduler])}  # fmt: skip
        return out


def timed(meter: CpuMeter, send) -> dict:
    """`send()`'s run with the CPU seconds each part spent while it ran (``cpu``)."""
    before = meter.read()
    run = send()
    after = meter.read()
    return kept(run) | {"cpu": {p: after[p] - before[p] for p in PARTS}}


def run_mode(mode: str, model, tokenizer, args) -> dict:
    """Start `mode`'s pair and send every prompt by both routes; its row (runs per route, in order)."""
    runs = {route: [] for route in ROUTES}
    with deployment(model, mode, args.link_gbps, args.segment_tokens, "zmq", args) as pd:
        warm_up(f"{pd.url}/generate", tokenizer, ["greedy"])
        meter = CpuMeter(pd)
        for repeat in range(args.repeats):
            body = request_body(tokenizer, args.prompt_tokens, repeat, "greedy", args.max_tokens, seed=0)
            nth = [1, args.max_tokens]
            send = {"router": lambda: stream_recorded(f"{pd.url}/generate", body, nth=nth),
                    "direct": lambda: stream_direct_recorded(pd, body, new_room(), nth=nth)}  # fmt: skip
            for route in ROUTES[repeat % 2:] + ROUTES[:repeat % 2]:
                pd.prefill.flush_cache()
                runs[route].append(timed(meter, send[route]) | {"repeat": repeat})
                print(f"  {mode} repeat {repeat} via {route}: t1 {runs[route][-1]['t1_s']:.2f}s", file=sys.stderr,
                      flush=True)  # fmt: skip
    return {"mode": mode, "runs": runs, **summarize(runs, args.max_tokens)}


def summarize(runs: dict[str, list[dict]], max_tokens: int) -> dict:
    """Medians per route (t1, the last token, each part's CPU seconds per request), the router's paired
    t1 ratio, and in how many prompts both routes gave the same tokens."""
    last = f"t{max_tokens}_s"
    routes = {route: {"t1_s": statistics.median(r["t1_s"] for r in rs),
                      "last_s": statistics.median(r[last] for r in rs),
                      "cpu": {p: statistics.median(r["cpu"][p] for r in rs) for p in PARTS}}
              for route, rs in runs.items()}  # fmt: skip
    pairs = list(zip(runs["router"], runs["direct"]))
    ratios = [a["t1_s"] / b["t1_s"] for a, b in pairs]
    return {"routes": routes, "router_over_direct_t1": statistics.median(ratios),
            "router_over_direct_t1_range": [min(ratios), max(ratios)],
            "same_tokens": sum(a["output_ids"] == b["output_ids"] for a, b in pairs),
            "prompts": len(pairs)}  # fmt: skip


def main(argv=None) -> int:
    document = run_modes(parse_args(argv), run_mode)
    print(markdown(document))
    return 0 if all(row["same_tokens"] == row["prompts"] for row in document["rows"]) else 1


def markdown(document: dict) -> str:
    """The docs' table (`scripts/doc_tables.py`): per mode and route the median t1 and CPU seconds per
    request of each part, then the router's paired t1 ratio and the routes' agreement per mode."""
    d, a = document, document["args"]
    lines = [f"{stamp(d)}: {a['link_gbps']:g} Gbit/s, {a['prompt_tokens']:,}-token prompts, {a['max_tokens']} tokens, "
             f"{a['repeats']} prompts per mode each sent by both routes; medians, CPU seconds per request:", "",
             *md.head(["mode", "via", "t1 s", f"t{a['max_tokens']} s", *PARTS])]  # fmt: skip
    for row in d["rows"]:
        for route, s in row["routes"].items():
            cells = [f"`{row['mode']}`", route, f"{s['t1_s']:.2f}", f"{s['last_s']:.2f}",
                     *(f"{s['cpu'][p]:.2f}" for p in PARTS)]  # fmt: skip
            lines.append(md.line(cells))
    ratios = "; ".join(f"`{r['mode']}` {r['router_over_direct_t1']:.3f} ({r['router_over_direct_t1_range'][0]:.3f}-"
                       f"{r['router_over_direct_t1_range'][1]:.3f}), same tokens by both routes in "
                       f"{r['same_tokens']} of {r['prompts']}" for r in d["rows"])  # fmt: skip
    lines += ["", f"t1 via the router / straight, paired median (range): {ratios}."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
