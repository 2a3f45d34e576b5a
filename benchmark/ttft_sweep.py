"""Time to the 1st, 8th, 32nd and 128th token of the real prefill/decode pair, per mode, link rate and request type.

For every (mode, link rate) a fresh deployment (prefill + decode with --lynx
and SGLang's router) is started. With `--side-by-side` two pairs run at once
(``lynx`` beside ``int4``, then beside ``int8``) and every measured request
goes to both in turn, the first one alternating, so each verdict compares
requests timed seconds apart on this shared machine. Each prompt length is
first sent once straight to both servers to time the prefill alone (`prefill_s`, the prefill
server's answer: prefill plus the KV snapshot), then, for every request type,
`--repeats` times (distinct essay text each time, prefill cache flushed) as a
streaming `/generate` through the router. Recorded per request: client-side
time to the first streamed token and to the N-th, the decode server's anchor
and residual arrival times, and in ``lynx`` mode the speculation and the cost
of each verify stage (`meta_info["lynx"]`). With `--floor`, a single
non-disaggregated server runs beside the pairs and answers every measured
request next to its pair's (the floor: no transfer at all; which of the two
goes first alternates), so both are timed under the same load and in the same
minute of a shared machine.

Request types (`--request-types`): ``greedy``; ``sampled`` (temperature 0.8,
top-p 0.95, a seed); ``logprobs`` (greedy with the top 5 logprobs of every
token and the logprobs of three fixed token ids, `TOKEN_IDS`); ``json`` (a
JSON schema); ``repetition`` (repetition penalty 1.2). Every type runs to
`--max-tokens` tokens (``ignore_eos``; the JSON schema asks for enough
items), and every request in every mode asks for the top logprobs
of each output token (2; 20 for ``sampled``): each ``lynx`` run is judged
token by token against the ``int8`` run of the same request (`ttft_outputs`:
near ties, then int8 continued from lynx's prefix on a loopback server
started after the sweep when a tie needs it). Each deployment (and the floor)
first answers one short untimed request of every type: a server's first
request of some types compiles kernels (~30 s once for the repetition
penalty here).

The link is emulated by the prefill sender's token bucket (`--lynx-link-gbps`), on
either transport (`--transports zmq,mooncake`). Frames are sized to the
emulated link (`--chunk-ms`: a residual frame holds up an anchor for at most
that long, as a 1 MiB frame does for well under a millisecond on a real
10-100 Gbit/s link).
A 135M model on two CPU cores prefills 2k tokens in about 7 s, far slower
than an 8B model on a GPU, so the link rates are scaled down to put the
ratio of BF16 KV transfer time to prefill time where clusters have it; the
table states that ratio per row (docs/BENCHMARKS.md).

    python benchmark/ttft_sweep.py --modes int8,int4,lynx --link-gbps 0.02,0.08 --prompt-tokens 1024
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import subprocess
import statistics
import sys
import time
from pathlib import Path

from lynx.config import MIN_CHUNK_BYTES, LynxConfig
from lynx.kvwire import KVShape, WireFormat
from lynx_deploy.models import SMOLLM2, prepare_smollm2
from lynx_deploy.deployment import PDDeployment, new_room
from lynx_deploy.server import CPU_MODEL_ARGS, SGLangServer
from lynx_testing import provenance
from lynx_testing.netns import INSIDE_ENV, isolated
from lynx_testing.prompts import chat_prompt, long_question
from ttft_outputs import LOGPROBS, judge_with_loopback, kept, stream_direct_recorded, stream_recorded
from ttft_verdicts import FLOOR, agreement, nth_keys, overlap, pipelining, verdicts

JSON_SCHEMA = {
    "type": "object",
    "properties": {"points": {"type": "array", "items": {"type": "string", "minLength": 24}, "minItems": 20}},
    "required": ["points"],
}
TOKEN_IDS = [11, 30, 198]  # SmolLM2's <jupyter_start>, "." and newline: mostly far below the top
WARM_UP_TOKENS = 64  # prompt length of the untimed warm-up requests
REQUEST_TYPES = {
    "greedy": {},
    "sampled": {"sampling_params": {"temperature": 0.8, "top_p": 0.95}},
    "logprobs": {"return_logprob": True, "top_logprobs_num": 5, "token_ids_logprob": TOKEN_IDS},
    "json": {"sampling_params": {"json_schema": json.dumps(JSON_SCHEMA)}},
    "repetition": {"sampling_params": {"repetition_penalty": 1.2}},
}
SIDE_BY_SIDE_MEM_FRACTION = "0.8"
VERIFY_STAGES = ("upgrade_s", "forward_s", "predict_s", "commit_s")


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--modes", default="int8,int4,lynx")
    parser.add_argument("--link-gbps", default="0.02,0.08", help="emulated link rates, Gbit/s")
    parser.add_argument("--prompt-tokens", default="1024")
    parser.add_argument("--request-types", default=",".join(REQUEST_TYPES))
    parser.add_argument("--transports", default="zmq",
                        help="--lynx-transport values, one deployment each (mooncake runs the sweep in a private "
                             "network namespace: its engine listens on every interface)")
    parser.add_argument("--segment-tokens", default="512",
                        help="--lynx-segment-tokens values, one deployment each (0 = the KV sent whole: pipelining off)")
    parser.add_argument("--chunk-ms", type=float, default=10.0,
                        help="frame size as time on the emulated link (--lynx-chunk-bytes = rate x this, "
                             "4 KiB..1 MiB); 0 keeps the server default")
    parser.add_argument("--chunked-prefill-size", type=int, default=512,
                        help="the PD servers' --chunked-prefill-size: the prefill computes (and Lynx sends) the "
                             "prompt chunk by chunk; the floor's single server keeps SGLang's default")
    parser.add_argument("--via", choices=("router", "direct"), default="router",
                        help="send each measured request through SGLang's router, or straight to both servers "
                             "(then each row also has the prefill server's own time for its requests, "
                             "`request_prefill_s`, which the overlap verdict uses)")
    parser.add_argument("--floor", action="store_true",
                        help="also time a single non-disaggregated server on the same prompts (the floor), "
                             "running beside the pairs: each measured pair request has the floor's twin next to it")
    parser.add_argument("--side-by-side", action="store_true",
                        help="run the modes of a link rate two pairs at a time (lynx beside each other mode in "
                             "turn; ~8 GB of memory per pair here) and send each request to both, the order "
                             "rotating per repeat: a verdict then compares requests timed in the same minute")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--nth", default="1,8,32,128", help="report time to these output tokens")
    parser.add_argument("--json", default="results/ttft_sweep.json")
    parser.add_argument("--log-dir", default="results/ttft_logs")
    args = parser.parse_args(argv)
    if set(_names(args.transports)) - {"zmq", "mooncake"}:
        parser.error(f"--transports: choose from zmq, mooncake; got {args.transports!r}")
    unknown = set(_names(args.request_types)) - set(REQUEST_TYPES)
    if unknown:
        parser.error(f"unknown request types {sorted(unknown)}; choose from {', '.join(REQUEST_TYPES)}")
    return args


def chunk_bytes(rate_gbps: float, chunk_ms: float) -> int | None:
    """`--lynx-chunk-bytes` for frames of `chunk_ms` on a `rate_gbps` link; None for the server default."""
    if rate_gbps <= 0 or chunk_ms <= 0:
        return None
    return max(MIN_CHUNK_BYTES, min(LynxConfig.chunk_bytes, int(rate_gbps * 1e9 / 8 * chunk_ms / 1000)))


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def _names(text: str) -> list[str]:
    return [x for x in text.split(",") if x]


def request_body(tokenizer, tokens: int, index: int, kind: str, max_tokens: int, seed: int) -> dict:
    """A streaming-ready `/generate` body of request type `kind` on essay text number `index`."""
    question = long_question(tokenizer, tokens, index=index)
    if kind == "json":
        question += " List the essay's points as JSON."
    extra = REQUEST_TYPES[kind]
    sampling = {"max_new_tokens": max_tokens, "temperature": 0, "ignore_eos": True, **extra.get("sampling_params", {})}
    if kind == "sampled":
        sampling["sampling_seed"] = seed
    body = {"text": chat_prompt(tokenizer, question), "sampling_params": sampling, "return_logprob": True}
    body |= {k: v for k, v in extra.items() if k != "sampling_params"}
    body["top_logprobs_num"] = max(body.get("top_logprobs_num", 0), LOGPROBS["sampled" if kind == "sampled" else "greedy"])
    return body


def warm_up_bodies(tokenizer, kinds: list[str]) -> list[dict]:
    """One short untimed request per request type: a server's first request of some types
    compiles kernels (the first repetition-penalty request took ~30 s more on this CPU)."""
    return [request_body(tokenizer, WARM_UP_TOKENS, 999, kind, max_tokens=4, seed=1) for kind in kinds]


def warm_up(url: str, tokenizer, kinds: list[str]) -> None:
    """Send `warm_up_bodies` to `url` (a deployment's or the floor's `/generate`), untimed."""
    for body in warm_up_bodies(tokenizer, kinds):
        stream_recorded(url, body)


def prefill_seconds(pd: PDDeployment, tokenizer, tokens: int) -> float:
    """How long the prefill server takes to answer one prompt of `tokens` tokens (sent straight to both)."""
    pd.prefill.flush_cache()
    body = {"text": chat_prompt(tokenizer, long_question(tokenizer, tokens, index=997)),
            "sampling_params": {"max_new_tokens": 1, "temperature": 0}}  # fmt: skip
    prefill, _ = pd.generate_direct(body)
    if not isinstance(prefill, dict):
        raise RuntimeError(f"prefill calibration failed: {prefill}")
    return prefill["meta_info"]["e2e_latency"]


def point_body(tokenizer, tokens: int, kind: str, repeat: int, args) -> dict:
    """The body of repeat `repeat` of a (prompt length, request type) point: the same for every mode."""
    index = repeat + 7 * tokens + 31 * list(REQUEST_TYPES).index(kind)
    return request_body(tokenizer, tokens, index, kind, args.max_tokens, seed=1000 + repeat)


def run_point(pd: PDDeployment, tokenizer, tokens: int, kind: str, repeat: int, args) -> dict:
    """One measured request; its run names it (``request``: the asked prompt length and the repeat)."""
    pd.prefill.flush_cache()
    body = point_body(tokenizer, tokens, kind, repeat, args)
    if getattr(args, "via", "router") == "direct":
        run = stream_direct_recorded(pd, body, new_room(), nth=_ints(args.nth))
    else:
        run = stream_recorded(f"{pd.url}/generate", body, nth=_ints(args.nth))
    return run | {"request": [tokens, repeat]}


def run_floor(server: SGLangServer, tokenizer, tokens: int, kind: str, repeat: int, args) -> dict:
    """The same request on the single server (the floor)."""
    server.flush_cache()
    body = point_body(tokenizer, tokens, kind, repeat, args)
    return stream_recorded(f"{server.url}/generate", body, nth=_ints(args.nth)) | {"request": [tokens, repeat]}


def main(argv=None) -> int:
    from transformers import AutoTokenizer

    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    args.started = time.time()  # the JSON's wall time counts from here
    if "mooncake" in _names(args.transports) and os.environ.get(INSIDE_ENV) != "1":
        return subprocess.call(isolated([sys.executable, str(Path(__file__).resolve()), *argv]))
    model = prepare_smollm2()
    tokenizer = AutoTokenizer.from_pretrained(str(model))
    rows = []
    segments = _ints(args.segment_tokens)
    points = [(m, float(r), g, t) for m in _names(args.modes) for r in _names(args.link_gbps) for g in segments
              for t in _names(args.transports)]  # fmt: skip
    kinds = _names(args.request_types)
    prefill_times: dict[int, list[float]] = {}
    floor_runs: dict[tuple[int, str], list[dict]] = {}
    with contextlib.ExitStack() as stack:
        floor = stack.enter_context(floor_server(model, args)) if args.floor else None
        if floor is not None:
            warm_up(f"{floor.url}/generate", tokenizer, kinds)
        sweep_points(points, model, tokenizer, kinds, args, rows, prefill_times, floor, floor_runs)
    rows += floor_rows(floor_runs, prefill_times)
    judged = judge_outputs(rows, model, tokenizer, args)
    write_json(args, rows)  # also gives every row its transfer/prefill ratio, which the table shows
    print_table(rows)
    print()
    print_verdicts(verdicts(rows))
    for p in pipelining(rows):
        print(f"pipelining {p['mode']} {p['link_gbps']:g} Gbps {p['prompt_tokens']} tokens {p['request_type']}: "
              f"t1 segments of {p['segment_tokens']} / whole = {p['t1_on_over_off']:.3f}")  # fmt: skip
    for o in overlap(rows):
        ratio = f", int8 t1 / lynx t1 = {o['int8_over_lynx_t1']:.3f}" if "int8_over_lynx_t1" in o else ""
        print(f"overlap {o['link_gbps']:g} Gbps {o['prompt_tokens']} tokens {o['request_type']}: lynx t1 / "
              f"(max(prefill {o['prefill_s']:.2f}s, anchor {o['anchor_s']:.2f}s) + step {o['step_s']:.2f}s) = "
              f"{o['t1_vs_bound']:.3f}{ratio}")  # fmt: skip
    for a in agreement(rows):
        parted = f", parted at repeats {a['parted_repeats']}" if a["parted_repeats"] else ""
        print(f"outputs {a['link_gbps']:g} Gbps {a['prompt_tokens']} tokens {a['request_type']}: lynx text equals "
              f"int8's in {a['equal']} of {a['compared']}{parted}")  # fmt: skip
    for j in judged:
        print(f"judged {j['link_gbps']:g} Gbps {j['prompt_tokens']} tokens {j['request_type']}: lynx vs int8 "
              f"{j['summary']}")  # fmt: skip
    print(f"\nJSON: {args.json}")
    return 0 if all(j["ok"] for j in judged) else 1


def judge_outputs(rows: list[dict], model, tokenizer, args) -> list[dict]:
    """`ttft_outputs.judge_rows` on the sweep's rows, continuations on a loopback server with the pairs' chunked prefill."""
    server_args = [*CPU_MODEL_ARGS, "--chunked-prefill-size", str(args.chunked_prefill_size)]

    def request_of(row: dict, run: dict) -> dict:
        tokens, repeat = run["request"]
        return point_body(tokenizer, tokens, row["request_type"], repeat, args)

    return judge_with_loopback(rows, request_of, tokenizer.encode, model, server_args, Path(args.log_dir))


def sweep_points(points, model, tokenizer, kinds, args, rows, prefill_times, floor, floor_runs) -> None:
    """Run the deployment groups of `point_groups` one after another. Each measured request goes to
    every deployment of the running group (and the floor) in turn, the order rotating with the
    repeat, so the modes compared in a verdict are timed in the same minute of this shared machine."""
    groups = point_groups(points, args.side_by_side)
    for done, group in enumerate(groups, start=1):
        with contextlib.ExitStack() as stack:
            pds = {}
            for mode, rate, segment, transport in group:
                print(f"[{done}/{len(groups)}] mode={mode} link={rate} Gbps segments={segment} transport={transport}: "
                      "starting deployment", file=sys.stderr, flush=True)  # fmt: skip
                pds[mode] = stack.enter_context(deployment(model, mode, rate, segment, transport, args))
            for pd in pds.values():
                warm_up(f"{pd.url}/generate", tokenizer, kinds)
            for tokens in _ints(args.prompt_tokens):
                prefills = {mode: prefill_seconds(pd, tokenizer, tokens) for mode, pd in pds.items()}
                prefill_times.setdefault(tokens, []).extend(prefills.values())
                for kind in kinds:
                    runs = {mode: [] for mode in pds}
                    lanes = [*pds, *([FLOOR] if floor is not None else [])]
                    for repeat in range(args.repeats):
                        turn = repeat % len(lanes)
                        for lane in lanes[turn:] + lanes[:turn]:
                            if lane == FLOOR:
                                floor_runs.setdefault((tokens, kind), []).append(
                                    run_floor(floor, tokenizer, tokens, kind, repeat, args))
                            else:
                                runs[lane].append(run_point(pds[lane], tokenizer, tokens, kind, repeat, args))
                    for mode, rate, segment, transport in group:
                        point = {"segment_tokens": segment, "transport": transport,
                                 "chunk_bytes": chunk_bytes(rate, args.chunk_ms),
                                 "group": done if args.side_by_side else None}  # fmt: skip
                        rows.append(summarize(mode, rate, tokens, kind, prefills[mode], runs[mode]) | point)
                        print(f"    {mode} {tokens} tokens, {kind}: t1 {rows[-1]['t1_s']:.2f}s, "
                              f"prefill {prefills[mode]:.2f}s", file=sys.stderr, flush=True)  # fmt: skip
        write_json(args, rows)  # what was measured so far survives a later failure


def point_groups(points: list[tuple], side_by_side: bool) -> list[list[tuple]]:
    """The deployments that run at once: each point alone, or with `side_by_side` the modes of one
    (link rate, segments, transport) together, in the order the points come. Two pairs at a time
    is what this machine's memory holds (a server takes ~4 GB in all), so ``lynx`` runs beside
    each other mode in turn when there are more than two."""
    if not side_by_side:
        return [[p] for p in points]
    groups: dict[tuple, list[tuple]] = {}
    for point in points:
        groups.setdefault(point[1:], []).append(point)
    out = []
    for group in groups.values():
        lynx = [p for p in group if p[0] == "lynx"]
        others = [p for p in group if p[0] != "lynx"]
        out += [[*lynx, other] for other in others] if lynx and len(others) > 1 else [group]
    return out


def deployment(model, mode: str, rate: float, segment: int, transport: str, args) -> PDDeployment:
    """The prefill/decode pair of one point: `mode` on a `rate` Gbit/s emulated link."""
    lynx_args = ["--lynx-mode", mode, "--lynx-link-gbps", str(rate), "--lynx-insecure",
                 "--lynx-segment-tokens", str(segment), "--lynx-transport", transport]  # fmt: skip
    frame = chunk_bytes(rate, args.chunk_ms)
    if frame is not None:
        lynx_args += ["--lynx-chunk-bytes", str(frame)]
    log_dir = Path(args.log_dir) / f"{mode}-{rate}-{segment}-{transport}"
    server_args = [*CPU_MODEL_ARGS, "--chunked-prefill-size", str(args.chunked_prefill_size)]
    if args.side_by_side:
        # Memory is counted machine-wide here: a server starting beside running ones sees their
        # memory as taken by its own weights; --max-total-tokens still bounds every pool.
        server_args += ["--mem-fraction-static", SIDE_BY_SIDE_MEM_FRACTION]
    return PDDeployment(model, lynx_args, extra_args=server_args, log_dir=log_dir, max_total_tokens=32768)


# Arguments of this run on this machine only (where its logs went, when it started), not in the JSON.
LOCAL_ARGS = ("started", "log_dir")


def write_json(args, rows: list[dict]) -> None:
    """The rows (each run's tokens, not its top logprobs, which only the judging reads), verdicts and judgement."""
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    add_ratios(rows)
    kept_rows = [r | {"runs": [kept(run) for run in r["runs"]]} for r in rows]
    wall_s = round(time.time() - args.started) if getattr(args, "started", None) else None
    document = {"date": time.strftime("%Y-%m-%d"), "commit": provenance.commit(Path(__file__).parent), "wall_s": wall_s,
                "args": {k: v for k, v in vars(args).items() if k not in LOCAL_ARGS}, "rows": kept_rows,
                "verdicts": verdicts(rows), "pipelining": pipelining(rows), "overlap": overlap(rows),
                "agreement": agreement(rows)}  # fmt: skip
    Path(args.json).write_text(json.dumps(document, indent=2))


def floor_server(model, args) -> SGLangServer:
    """The single non-disaggregated server (the floor), started before the first pair and kept
    beside every one, so each of its requests is timed next to its pair twin (the same load and
    the same minute of this shared machine's speed)."""
    print("floor: starting a single server", file=sys.stderr, flush=True)
    log = Path(args.log_dir) / "floor.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    return SGLangServer(model, ["--lynx", *CPU_MODEL_ARGS], max_total_tokens=32768, log_path=log)


def floor_rows(floor_runs: dict[tuple[int, str], list[dict]], prefill_times: dict[int, list[float]]) -> list[dict]:
    """One row per (prompt length, request type) of the floor's runs: no transfer at all."""
    rows = []
    for (tokens, kind), runs in floor_runs.items():
        prefill_s = statistics.median(prefill_times[tokens]) if prefill_times.get(tokens) else None
        rows.append(summarize(FLOOR, None, tokens, kind, prefill_s, runs) | {"segment_tokens": None, "transport": None})
    return rows


def summarize(mode: str, rate: float, tokens: int, kind: str, prefill_s: float, runs: list[dict]) -> dict:
    def median(key):
        values = [r[key] for r in runs if r.get(key) is not None]
        return statistics.median(values) if values else None

    prompt_tokens = runs[0]["prompt_tokens"]
    shape = KVShape(SMOLLM2.num_layers, prompt_tokens, SMOLLM2.kv_heads, SMOLLM2.head_dim, _bf16())
    stream_bytes = () if mode == FLOOR else WireFormat.for_mode(mode, "int8").stream_sizes(shape)
    return {
        "mode": mode,
        "link_gbps": rate,
        "prompt_tokens": prompt_tokens,
        "request_type": kind,
        "stream_bytes": list(stream_bytes),
        "prefill_s": prefill_s,
        "request_prefill_s": median("prefill_s"),
        **{k: median(k) for k in nth_keys(runs)},
        "anchor_ready_s": median("anchor_ready_s"),
        "residual_ready_s": median("residual_ready_s"),
        "manifest_s": median("manifest_s"),
        "completion_tokens": median("completion_tokens"),
        **_speculation(runs),
        "repeats": len(runs),
        "runs": [{k: v for k, v in r.items() if k != "text"} | {"output_sha": output_digest(r)} for r in runs],
    }


def output_digest(run: dict) -> str | None:
    """A short digest of a run's output text: equal outputs of two modes have equal digests."""
    if run.get("text") is None:
        return None
    return hashlib.sha256(run["text"].encode()).hexdigest()[:16]


def _speculation(runs: list[dict]) -> dict:
    """Lynx mode: drafted tokens, how many verify accepted, rollbacks (totals), verify stages (medians)."""
    if not any("speculative_tokens" in r for r in runs):
        return {}
    spec = sum(r.get("speculative_tokens", 0) for r in runs)
    accepted = sum(r.get("accepted_tokens", 0) for r in runs)
    stages = {k: statistics.median([r.get(k, 0.0) for r in runs]) for k in VERIFY_STAGES}
    return {
        "speculative_tokens": spec,
        "accepted_tokens": accepted,
        "acceptance": accepted / spec if spec else None,
        "rollbacks": sum(r.get("rollbacks", 0) for r in runs),
        **stages,
    }


def add_ratios(rows: list[dict]) -> None:
    """BF16 KV transfer time over prefill time, per row (the x-axis of every TTFT comparison)."""
    for row in rows:
        if row["link_gbps"] is None:
            row["bf16_transfer_to_prefill"] = None
            continue
        bf16_bytes = 2 * 2 * row["prompt_tokens"] * SMOLLM2.num_layers * SMOLLM2.kv_heads * SMOLLM2.head_dim
        transfer_s = bf16_bytes * 8 / (row["link_gbps"] * 1e9)
        row["bf16_transfer_to_prefill"] = transfer_s / row["prefill_s"] if row["prefill_s"] else None


def print_table(rows: list[dict]) -> None:
    def fmt(value, spec=".2f"):
        return "-" if value is None else format(value, spec)

    extra = nth_keys(rows)
    header = (
        f"{'mode':5} {'via':8} {'Gbps':>5} {'seg':>4} {'tokens':>6} {'type':10} {'xfer/pf':>7} {'anchor':>6} {'resid':>6} "
        f"{'accept':>6} {'rollbk':>6} {'upgr s':>6} {'fwd s':>6}"
    )
    print(header + "".join(f" {k[:-2]:>7}" for k in extra))
    for r in rows:
        line = (
            f"{r['mode']:5} {r.get('transport') or '-':8} {fmt(r['link_gbps'], 'g'):>5} {fmt(r['segment_tokens'], 'd'):>4} {r['prompt_tokens']:>6} {r['request_type']:10} "
            f"{fmt(r['bf16_transfer_to_prefill']):>7} {fmt(r['anchor_ready_s']):>6} {fmt(r['residual_ready_s']):>6} "
            f"{fmt(r.get('acceptance')):>6} {fmt(r.get('rollbacks'), 'd'):>6} {fmt(r.get('upgrade_s')):>6} "
            f"{fmt(r.get('forward_s')):>6}"
        )
        print(line + "".join(f" {fmt(r.get(k)):>7}" for k in extra))


def print_verdicts(entries: list[dict]) -> None:
    for e in entries:
        ratios = " ".join(f"{k}={v:.3f}" for k, v in e.items() if k.endswith(("_vs_int4", "_vs_int8", "_vs_floor")))
        verdict = {True: "met ", False: "MISS", None: "n/a "}[e["met"]]
        paired = " ".join(f"{k}={v:.3f}" for k, v in e.get("paired", {}).items())
        paired = f" (paired per request: {paired})" if paired else ""
        print(f"{verdict} {e['link_gbps']:g} Gbps {e['prompt_tokens']} tokens {e['request_type']}: {ratios}{paired}")


def _bf16():
    import torch

    return torch.bfloat16


if __name__ == "__main__":
    sys.exit(main())
