"""Serving under load: SGLang's own `sglang.bench_serving` against real prefill/decode pairs, per mode.

For every mode (`bf16`, `int8`, `int4`, `lynx`, `auto`, and SGLang's stock
Mooncake backend with a BF16 KV cache, `stock`, and with an FP8 one, `stock-fp8`) a deployment (prefill + decode + SGLang's router `smg`) is
started and `sglang.bench_serving` sends it Poisson arrivals at each request
rate (`random-ids` prompts, greedy, EOS ignored), then `generated-shared-prefix`
prompts and a scaled replay of Mooncake's published conversation trace; two
prefill servers feeding one decode server make the fan-in point. Every mode
gets the same prompts (bench_serving's seed) and the same arrivals. Last,
`int8` and `lynx` pairs alone on a slower link (2k-token prompts, BF16's
transfer 4x their prefill) time the link-bound first token idle.

The link is set from this machine: a single server's prefill of one prompt is
timed first, and the link rate puts BF16's transfer of a prompt at
`--bf16-over-prefill` times that. Request rates are given as the offered load
on `int8`'s link (`--loads`). Every `lynx` and `auto` answer is judged token
by token against `int8`'s answer to the same prompt at the same point (the
near-tie rule; after a tie the rest is judged against a reference continued
from the candidate's own prefix, `lynx_testing.judge`).

    python benchmark/serving_load.py                      # the default profile (~40 min here)
    python benchmark/serving_load.py --profile smoke      # a few minutes, wiring only
    python benchmark/serving_load.py --from-json docs/results/serving_load.json   # table, plots, docs section again

SGLang's stock backend (either KV cache) needs a private network namespace (Mooncake listens on
every interface) and kernel shaping, so a run that includes it or the fan-in
point re-executes itself under `unshare --net` (root or user namespaces, `tc`).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from evaluation.link import ShapedLoopback, inside_namespace
from load import deployments, report
from load.judging import judge_points
from load.plan import (
    PROFILES,
    REFERENCE_MODE,
    STOCK,
    STOCK_FP8,
    STOCK_MODES,
    STREAM_MODES,
    Link,
    Point,
    base_mode,
    link_for,
    points,
    with_overrides,
)
from load.runs import bench_argv, read_records, read_result, run_points
from load.stats import achieved_utilization, bench_summary, failures, lynx_timeline
from load.trace import TRACE_NAME, read_trace, scale_trace, write_trace
from lynx_testing.netns import isolated


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", choices=sorted(PROFILES), default="default")
    parser.add_argument("--modes", help="comma-separated modes (default: the profile's)")
    parser.add_argument("--loads", help="comma-separated offered loads on int8's link, e.g. 0.3,0.85")
    parser.add_argument("--requests", type=int, help="requests per point")
    parser.add_argument("--bf16-over-prefill", type=float, help="BF16 transfer time of one prompt over its prefill")
    for name in ("shared-prefix", "trace", "fan-in"):
        parser.add_argument(f"--{name}-modes", help=f"comma-separated modes of the {name} points ('' for none)")
    parser.add_argument("--trace-requests", type=int, help="requests replayed from the trace")
    parser.add_argument("--idle-modes", help="comma-separated modes timed idle on the slower link ('' for none)")
    parser.add_argument("--idle-bf16-over-prefill", type=float,
                        help="BF16 transfer over prefill on the idle-only link (default: the profile's, 4)")
    parser.add_argument("--trace-path", type=Path,
                        help=f"Mooncake's {TRACE_NAME} (kvcache-ai/Mooncake, FAST25-release/traces/); "
                             "without it the trace points are skipped")  # fmt: skip
    parser.add_argument("--out", type=Path, default=Path("results/serving_load"), help="folder for JSON, plots, logs")
    parser.add_argument("--from-json", type=Path, help="rebuild the table, plots and docs section from a result")
    parser.add_argument("--rejudge", action="store_true",
                        help="judge the answers of the run in --out again (its per-request records) and rewrite its JSON")  # fmt: skip
    return parser.parse_args(argv)


def split(text: str) -> tuple[str, ...]:
    """The items of a comma-separated option."""
    return tuple(x for x in text.split(",") if x)


def profile_of(args):
    return with_overrides(
        PROFILES[args.profile],
        modes=split(args.modes) if args.modes else None,
        loads=tuple(float(x) for x in split(args.loads)) if args.loads else None,
        requests=args.requests,
        light_requests=args.requests,
        bf16_over_prefill=args.bf16_over_prefill,
        shared_prefix_modes=None if args.shared_prefix_modes is None else split(args.shared_prefix_modes),
        trace_modes=None if args.trace_modes is None else split(args.trace_modes),
        fan_in_modes=None if args.fan_in_modes is None else split(args.fan_in_modes),
        trace_requests=args.trace_requests,
        idle_modes=None if args.idle_modes is None else split(args.idle_modes),
        idle_bf16_over_prefill=args.idle_bf16_over_prefill,
    )


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.from_json:
        report.publish(json.loads(args.from_json.read_text()), args.out)
        return 0
    if args.rejudge:
        return rejudge(args.out)
    profile = profile_of(args)
    needs_namespace = bool(set(STOCK_MODES) & set(profile.modes)) or bool(profile.fan_in_modes)
    if needs_namespace and not inside_namespace(os.environ):
        return subprocess.call(isolated([sys.executable, str(Path(__file__).resolve()), *argv]))
    from lynx_deploy.models import prepare_smollm2

    model = prepare_smollm2()
    profile = with_overrides(profile, extra={"model": str(model)})
    (args.out / "logs").mkdir(parents=True, exist_ok=True)
    loopback = None
    if inside_namespace(os.environ):
        loopback = ShapedLoopback()
        loopback.configure_tcp()
        loopback.set_rate(None)
    started = time.monotonic()
    result = measure(profile, model, args, loopback)
    result["wall_s"] = round(time.monotonic() - started, 1)
    path = args.out / "serving_load.json"
    path.write_text(json.dumps(result, indent=1))
    report.publish(result, args.out)
    print(f"\nJSON: {path}  ({result['wall_s'] / 60:.1f} min)")
    return 0


def log(message: str) -> None:
    print(f"[serving_load {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def measure(profile, model: Path, args, loopback) -> dict:
    log("calibrating: a single server's prefill of one prompt")
    prompt = list(range(1000, 1000 + profile.input_tokens))
    reference = deployments.reference_server(model, args.out / "logs").start()
    try:
        reference.wait_ready()
        prefill_s = deployments.prefill_seconds(reference, prompt)
        link = link_for(prefill_s, stream_bytes(profile.input_tokens), profile.bf16_over_prefill)
        log(f"prefill {prefill_s:.2f} s; link {link.gbps:.4f} Gbit/s (BF16 transfer {link.bf16_over_prefill:.2f}x "
            f"the prefill; int8 saturates at {link.rate_for(1.0):.3f} req/s)")  # fmt: skip
        trace = prepare_trace(profile, link, args)
        plan = [p for p in points(profile) if p.dataset != "trace" or trace is not None]
        rows, idle, slo_ms, failed = [], {}, None, {}
        for group in deployment_groups(plan):
            mode, topology = group[0].mode, group[0].topology
            try:
                slo_ms = run_deployment(group, link, profile, model, args, loopback, trace, prompt, idle, slo_ms, rows)
            except Exception as exc:  # one deployment that cannot serve leaves the others' points standing
                note_failure(failed, f"{topology}/{mode}", exc)
            partial = {"profile": profile_dict(profile), "link": link.as_dict(), "idle": idle, "failed": failed,
                       "rows": [strip(r) for r in rows]}  # fmt: skip
            (args.out / "serving_load.partial.json").write_text(json.dumps(partial))
        link_bound = idle_link_bound(profile, reference, args, failed)
        log("judging lynx and auto answers against int8's, token by token")
        exactness = judge_points(rows, reference.url)
    finally:
        reference.stop()
    return {"profile": profile_dict(profile), "link": link.as_dict(), "idle": idle, "ttft_slo_ms": slo_ms,
            "idle_link_bound": link_bound, "failed": failed, "rows": [strip(r) for r in rows],
            "exactness": exactness}  # fmt: skip


def idle_link_bound(profile, reference, args, failed: dict) -> dict | None:
    """Each of `profile.idle_modes` alone, `idle_input_tokens`-token prompts on a link where BF16's
    transfer is `idle_bf16_over_prefill` x their prefill (timed on `reference`): the link-bound first
    token with nothing else on the link."""
    if not profile.idle_modes or not profile.idle_bf16_over_prefill:
        return None
    prompt = list(range(2000, 2000 + profile.idle_input_tokens))
    prefill_s = deployments.prefill_seconds(reference, prompt, repeats=3)
    slow = link_for(prefill_s, stream_bytes(profile.idle_input_tokens), profile.idle_bf16_over_prefill)
    idle = {}
    for mode in profile.idle_modes:
        log(f"{mode}: idle alone, {len(prompt)}-token prompts, prefill {prefill_s:.2f} s, on {slow.gbps:.4f} Gbit/s "
            f"(BF16 transfer {slow.bf16_over_prefill:.2f}x the prefill)")  # fmt: skip
        make = functools.partial(deployments.pair, mode, slow, profile, args.out / "logs" / f"idle-{mode}")
        try:
            pd = deployments.start_pair(make, log)
            try:
                idle[mode] = deployments.idle_ttft(pd, prompt, profile.output_tokens)
            finally:
                pd.stop()
        except Exception as exc:
            note_failure(failed, f"idle/{mode}", exc)
            continue
        log(f"{mode}: idle TTFT {idle[mode]['ttft_s']:.2f} s")
    return {"input_tokens": len(prompt), "link": slow.as_dict(), "idle": idle}


def note_failure(failed: dict, key: str, exc: Exception) -> None:
    """A deployment that did not serve: logged, and kept in the result under `key`."""
    log(f"{key} failed: {type(exc).__name__}: {exc}")
    failed[key] = f"{type(exc).__name__}: {str(exc)[-1500:]}"


def rejudge(out: Path) -> int:
    """Judge a finished run's answers again from its per-request records (a reference server is started)."""
    from lynx_deploy.models import prepare_smollm2

    path = out / "serving_load.json"
    result = json.loads(path.read_text())
    rows = []
    for row in result["rows"]:
        name = row["key"].replace("/", "_")
        records = out / "runs" / f"{row['topology']}-{row['mode']}" / f"{name}.records.jsonl"
        rows.append({**row, "records": read_records(records)})
    reference = deployments.reference_server(prepare_smollm2(), out / "logs").start()
    try:
        reference.wait_ready()
        result["exactness"] = judge_points(rows, reference.url)
    finally:
        reference.stop()
    path.write_text(json.dumps(result, indent=1))
    report.publish(result, out)
    return 0


def run_deployment(group, link, profile, model, args, loopback, trace, prompt, idle, slo_ms, rows) -> float | None:
    """Start one deployment, time it idle, run its points (appended to `rows`); the goodput SLO."""
    mode, topology = group[0].mode, group[0].topology
    shaped = mode in STOCK_MODES or topology == "2p1d"
    make = lambda: deployments.pair(mode, link, profile, args.out / "logs" / f"{topology}-{mode}",  # noqa: E731
                                    prefill_servers=2 if topology == "2p1d" else 1, shaped=shaped)  # fmt: skip
    log(f"{mode} ({topology}): starting the deployment")
    pd = deployments.start_pair(make, log)
    try:
        deployments.shape(loopback, pd, link.gbps if shaped else None)
        if topology == "1p1d":
            idle[mode] = deployments.idle_ttft(pd, prompt, profile.output_tokens)
            log(f"{mode}: idle TTFT {idle[mode]['ttft_s']:.2f} s")
            if slo_ms is None:
                slo_ms = 2000 * idle.get("int8", idle[mode])["ttft_s"]
        rows += run_group(group, pd, link, profile, model, args.out, trace, slo_ms)
    finally:
        if loopback is not None:
            deployments.shape(loopback, pd, None)
        pd.stop()
    return slo_ms


def stream_bytes(tokens: int) -> dict[str, int]:
    """The bytes one prompt of `tokens` tokens puts on the link, per mode."""
    import torch
    from lynx.kvwire import KVShape, WireFormat
    from lynx_deploy.models import SMOLLM2

    shape = KVShape(SMOLLM2.num_layers, tokens, SMOLLM2.kv_heads, SMOLLM2.head_dim, torch.bfloat16)
    sizes = {mode: sum(WireFormat.for_mode(mode, "int8").stream_sizes(shape)) for mode in STREAM_MODES}
    sizes[STOCK] = sizes["bf16"]
    sizes[STOCK_FP8] = sizes["bf16"] // 2  # one byte per KV element
    sizes["auto"] = sizes["lynx"]
    return sizes


def prepare_trace(profile, link: Link, args) -> Path | None:
    if not profile.trace_modes:
        return None
    if args.trace_path is None or not args.trace_path.exists():
        log(f"no Mooncake trace given (--trace-path {TRACE_NAME}); the trace points are skipped")
        return None
    rows = read_trace(args.trace_path)
    scaled = scale_trace(rows, len(rows) // 2, profile.trace_requests, profile.input_tokens, profile.output_tokens,
                         link.rate_for(profile.shared_prefix_load))  # fmt: skip
    return write_trace(scaled, args.out / "trace_scaled.jsonl")


def deployment_groups(plan: list[Point]) -> list[list[Point]]:
    """The points of each deployment, int8's first (its idle TTFT sets the goodput SLO of every mode)."""
    groups: dict[tuple, list[Point]] = {}
    for point in plan:
        groups.setdefault((point.mode, point.topology), []).append(point)
    return sorted(groups.values(), key=lambda g: (g[0].topology, g[0].mode != REFERENCE_MODE))


def run_group(group, pd, link: Link, profile, model: Path, out: Path, trace: Path | None, slo_ms) -> list[dict]:
    work = out / "runs" / f"{group[0].topology}-{group[0].mode}"
    work.mkdir(parents=True, exist_ok=True)
    runs = []
    for point in group:
        rate = None if point.load is None else link.rate_for(point.load)
        name = point.key.replace("/", "_")
        argv = bench_argv(point, pd.url, model, rate, profile, work / f"{name}.bench.jsonl", trace, slo_ms)
        runs.append((point, argv, work / f"{name}.records.jsonl"))
    log(f"{group[0].mode} ({group[0].topology}): bench_serving, {len(runs)} points")
    run_points(runs, work, out / "logs" / "bench_serving.log")
    rows = []
    for point, argv, records_path in runs:
        result = read_result(Path(argv[argv.index("--output-file") + 1]))
        records = read_records(records_path)
        rate = None if point.load is None else link.rate_for(point.load)
        summary = bench_summary(result)
        row = {"key": point.key, "mode": point.mode, "dataset": point.dataset, "topology": point.topology,
               "load": point.load, "rate": rate, **summary,
               "utilization": achieved_utilization(records, link.stream_bytes[base_mode(point.mode)], summary["duration_s"],
                                                   link.bytes_per_s),
               "errors": failures(records), **lynx_timeline(records), "records": records}  # fmt: skip
        log(f"  {point.key}: TTFT p50 {fmt(row['ttft_p50_ms'])} p99 {fmt(row['ttft_p99_ms'])} ms, "
            f"E2E p50 {fmt(row['e2e_p50_ms'])} p99 {fmt(row['e2e_p99_ms'])} ms, {len(row['errors'])} failed")
        rows.append(row)
    return rows


def fmt(value) -> str:
    return "-" if value is None else f"{value:.0f}"


LYNX_KEEP = ("anchor_ready_s", "residual_ready_s", "speculative_tokens", "accepted_tokens", "rollbacks", "verify_s",
             "verify_batch")  # fmt: skip


def strip(row: dict) -> dict:
    """The per-request records kept in the result (small): arrival, timings, Lynx timeline, an output digest."""
    first = min((r["started_wall"] for r in row["records"]), default=0.0)

    def keep(r: dict) -> dict:
        lynx = r.get("lynx") or {}
        return {"arrival_s": round(r["started_wall"] - first, 3), "ok": r.get("success"),
                "ttft_s": round(r.get("ttft_s") or 0, 3), "e2e_s": round(r.get("latency_s") or 0, 3),
                "output": digest(r.get("output_ids")),
                **{k: (round(lynx[k], 3) if isinstance(lynx[k], float) else lynx[k]) for k in LYNX_KEEP if k in lynx}}  # fmt: skip

    return {**row, "records": [keep(r) for r in row["records"]]}


def digest(ids) -> str | None:
    import hashlib

    return None if ids is None else hashlib.sha256(json.dumps(ids).encode()).hexdigest()[:12]


def profile_dict(profile) -> dict:
    from dataclasses import asdict

    return {k: v for k, v in asdict(profile).items() if k != "extra"}


if __name__ == "__main__":
    sys.exit(main())
