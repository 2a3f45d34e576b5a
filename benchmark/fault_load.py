"""Faults under load: each fault hits a `lynx` deployment while `sglang.bench_serving` loads it.

A deployment (one transport, one or three prefill servers feeding one decode
server, SGLang's router `smg` in front) runs `lynx` mode on a paced link
slower than its prefill makes KV, so the requests a fault hits are queued, on
the wire, drafting on their anchors or verifying. For each fault
(`faults/inject.py`: client aborts at each request state, a stalled prefill,
the prefill killed, the decode killed, the router restarted) bench_serving
sends the same Poisson load (`random-ids` prompts, greedy, EOS ignored, top-2
logprobs per token) and the fault comes a few seconds after its first request
reaches the decode server. Then, per fault:

- every answered request is judged token by token against `int8` decoding of
  its prompt (a reference server whose KV round-trips through `int8`'s wire
  format; the near-tie rule, then the rest against the reference continued
  from the answer's own prefix): `wrong` counts partings that are not near ties;
- every failed request's reason, as the client read it, must be a clear one
  (no traceback); a request still open when the load's deadline passes is `hung`;
- every server must come back to its idle levels (free KV slots and request
  rows, no Lynx room, resident memory within 5% of the first idle point) and
  answer a request that is judged the same way.

    python benchmark/fault_load.py                        # one ZeroMQ pair, every fault (~15 min here)
    python benchmark/fault_load.py --profile full         # ZeroMQ and Mooncake, one and three prefill servers
    python benchmark/fault_load.py --profile smoke        # aborts and a stall on a short load (a few minutes)
    python benchmark/fault_load.py --from-json docs/results/fault_load.json   # the table again
    python benchmark/fault_load.py --profile full --transports mooncake --prefills 3 --add-to RESULT.json
                                                          # rerun or add deployments to a result

Mooncake listens on every interface, so a run with it re-executes itself in a
private network namespace (`unshare --net`).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from evaluation.deployments import start
from evaluation.link import inside_namespace
from faults import levels, mixed
from faults.inject import inject
from faults.outcome import Judge, outcome
from faults.plan import FAULTS, PROFILES, Profile
from faults.soak import DATASETS as SOAK_DATASETS
from faults.soak import summary as soak_summary
from faults.report import markdown, passed, passed_deployment
from load.deployments import CHUNKED_PREFILL, MAX_TOTAL_TOKENS, SECRET_ARGS, reference_server
from load.plan import Point, with_overrides
from load.plan import Profile as LoadProfile
from load.runs import bench_argv, read_records, start_points
from lynx_deploy.deployment import PDDeployment
from lynx_deploy.processes import post_json
from lynx_deploy.server import CPU_MODEL_ARGS
from lynx_testing.judge import answer_of, server_continuation
from lynx_testing.netns import isolated
from lynx_testing import provenance

IDLE_WAIT_S = 180.0
PROBE_WAIT_S = 240.0


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", choices=sorted(PROFILES), default="default")
    parser.add_argument("--faults", help=f"comma-separated faults (of {', '.join(FAULTS)})")
    parser.add_argument("--transports", help="comma-separated: zmq, mooncake")
    parser.add_argument("--prefills", help="comma-separated prefill-server counts, e.g. 1,3")
    parser.add_argument("--requests", type=int, help="bench_serving prompts per fault")
    parser.add_argument("--rate", type=float, help="Poisson arrival rate, requests/s")
    parser.add_argument("--soak-minutes", type=float, help="after the faults, rounds of load with aborts this long")
    parser.add_argument("--out", type=Path, default=Path("results/fault_load"), help="folder for JSON and logs")
    parser.add_argument("--from-json", type=Path, help="print the table of a committed result again")
    parser.add_argument("--add-to", type=Path,
                        help="add this run's deployments to that result (same load settings), replacing any it reran")  # fmt: skip
    return parser.parse_args(argv)


def profile_of(args) -> Profile:
    def items(text):
        return tuple(x for x in text.split(",") if x) if text else None

    prefills = items(args.prefills)
    return with_overrides(PROFILES[args.profile], faults=items(args.faults), transports=items(args.transports),
                          prefills=tuple(int(p) for p in prefills) if prefills else None, requests=args.requests,
                          rate=args.rate, soak_minutes=args.soak_minutes)  # fmt: skip


def deployment(transport: str, prefills: int, profile: Profile, model: Path, log_dir: Path) -> PDDeployment:
    lynx_args = ["--lynx-mode", "lynx", *SECRET_ARGS, "--lynx-link-gbps", str(profile.link_gbps),
                 "--lynx-transfer-timeout", str(profile.transfer_timeout_s), "--lynx-transport", transport]  # fmt: skip
    # SGLang's default memory fraction (not the load benchmark's 0.5): up to five servers start at once
    # here, and each counts the memory the others load meanwhile as taken; the pool is capped anyway.
    return PDDeployment(model, lynx_args, log_dir=log_dir, max_total_tokens=MAX_TOTAL_TOKENS,
                        extra_args=[*CPU_MODEL_ARGS, "--chunked-prefill-size", str(CHUNKED_PREFILL)],
                        prefill_servers=prefills)  # fmt: skip


def load_argv(profile: Profile, pd: PDDeployment, model: Path, out: Path, dataset: str = "random-ids") -> list[str]:
    """bench_serving's options: `profile.requests` prompts at `profile.rate` (the load benchmark's own)."""
    load = LoadProfile(modes=("int8", "lynx"), requests=profile.requests, light_requests=profile.requests,
                       input_tokens=profile.input_tokens, output_tokens=profile.output_tokens, seed=profile.seed)  # fmt: skip
    return bench_argv(Point("lynx", dataset, 1.0), pd.url, model, profile.rate, load, out, None, None)


def wait_first_request(pd: PDDeployment, bench: subprocess.Popen, wait_s: float = 300.0) -> None:
    """Until the decode server holds a room (bench_serving's imports take ~20 s before it sends)."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline and bench.poll() is None:
        level = levels.server_levels(pd.decode)
        if level is not None and level["transfer_rooms"] > 0:
            return
        time.sleep(0.5)


def probe(pd: PDDeployment, judge: Judge, profile: Profile, vocab: int) -> float | None:
    """Seconds until a request through the router is answered and judged equal to int8's (one every
    5 s: after a restart the router takes a worker back once its health checks pass and its circuit
    breaker closes, 60 s after it opened); None if none is within `PROBE_WAIT_S`."""
    body = {"input_ids": [(i * 7919) % (vocab - 200) + 100 for i in range(profile.input_tokens // 2)],
            "sampling_params": {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True},
            "return_logprob": True, "top_logprobs_num": 2}  # fmt: skip
    started = time.monotonic()
    while time.monotonic() - started < PROBE_WAIT_S:
        try:
            reply = post_json(f"{pd.url}/generate", body, timeout=300)
        except OSError:
            time.sleep(5.0)
            continue
        prompt = tuple(body["input_ids"])
        exact = judge.judge_answers([((prompt, 8), answer_of(prompt, reply))]).ok
        return round(time.monotonic() - started, 1) if exact else None
    return None


def run_fault(fault: str, pd: PDDeployment, profile: Profile, ctx: dict, dataset: str = "random-ids",
              key: str | None = None, beside: Callable[[], dict] | None = None) -> dict:  # fmt: skip
    """One load with `fault` injected; `beside` (if given) runs in a thread from the load's first request
    on, and what it returns is the result's ``beside``."""
    key = key or f"{ctx['name']}-{fault}"
    work, log = ctx["work"], ctx["log"]
    records_path = work / f"{key}.jsonl"
    argv = load_argv(profile, pd, ctx["model"], work / f"{key}.bench.jsonl", dataset)
    started = time.monotonic()
    bench = start_points([(None, argv, records_path)], work, log)
    fault_wall, extra = None, {}
    try:
        wait_first_request(pd, bench)
        if beside is not None:
            alongside = threading.Thread(target=_into, args=(extra, "beside", beside), daemon=True)
            alongside.start()
        time.sleep(profile.fault_after_s)
        fault_wall = time.time()
        note = inject(fault, pd, profile, ctx["vocab"])
        deadline = started + 60 + 2 * profile.load_window_s + 3 * profile.transfer_timeout_s + 240
        try:
            bench.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            note["load_killed_at_deadline"] = True
        if beside is not None:
            alongside.join(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        if bench.poll() is None:
            os.killpg(bench.pid, 9)
            bench.wait()
    records = read_records(records_path) if records_path.exists() else []
    result = {"fault": fault, **outcome(records, profile.requests, None if fault == "none" else fault_wall, ctx["judge"]),
              "note": note, "load_s": round(time.monotonic() - started, 1), **extra}  # fmt: skip
    baseline = ctx.get("baseline")
    floor = baseline or {name: {"kv_free_slots": 0, "req_rows_free": 0} for name in levels.servers(pd)}
    now, waited = levels.wait_idle(pd, floor, IDLE_WAIT_S)
    if baseline is None:  # the first, fault-free load: its idle levels are the baseline
        baseline = ctx["baseline"] = now
    result.update(levels.compare(now, baseline), idle_after_s=round(waited, 1),
                  rss_mib=round(sum(level["rss_mib"] for level in now.values() if level), 1),
                  available_mib=levels.available_mib())  # fmt: skip
    if result["available_mib"] < levels.LOW_MEMORY_MIB:
        ctx["say"](f"  warning: {result['available_mib']} MiB of memory available: resident memory reads low "
                   "(the kernel evicts mapped pages); run nothing else beside the benchmark")  # fmt: skip
    result["serving_again_s"] = probe(pd, ctx["judge"], profile, ctx["vocab"])
    result["serves_after"] = result["serving_again_s"] is not None
    result["passed"] = passed(result)
    return result


def run_deployment(transport: str, prefills: int, profile: Profile, ctx: dict) -> dict:
    """Every fault (then the soak) on one fresh deployment; an error that stops it is recorded with what ran."""
    name = f"{transport}-{prefills}p"
    log_dir = ctx["out"] / "logs" / name
    say = ctx["say"]
    out: dict = {"transport": transport, "prefills": prefills, "faults": []}
    run = {**ctx, "name": name, "log": log_dir / "bench.log", "work": log_dir}
    pd = None
    try:
        say(f"{name}: starting {prefills} prefill server(s), the decode server and the router")
        pd = start(lambda: deployment(transport, prefills, profile, ctx["model"], log_dir), log=say)
        for i, fault in enumerate(profile.ordered_faults):
            say(f"{name}: [{i + 1}/{len(profile.ordered_faults)}] {fault} under {profile.requests} requests at "
                f"{profile.rate:g}/s")  # fmt: skip
            out["faults"].append(run_fault(fault, pd, profile, run))
            _say_outcome(say, out["faults"][-1])
        if profile.soak_minutes:
            rounds = out["soak_rounds"] = []
            soak(pd, profile, run, rounds)
            out["soak"] = {**soak_summary(rounds), "per_round": out.pop("soak_rounds")}
    except Exception as exc:  # recorded; the run's verdict fails
        out["error"] = f"{type(exc).__name__}: {exc}"[:2000]
        say(f"{name}: stopped by {out['error'][:300]}")
    finally:
        if pd is not None:
            pd.stop()
    return out


def soak(pd: PDDeployment, profile: Profile, run: dict, rounds: list[dict]) -> None:
    """Rounds of load with client aborts and one request of each other kind (`faults/mixed.py`) beside
    it, into `rounds`, until `profile.soak_minutes` have passed (a new seed each)."""
    started = time.monotonic()
    while time.monotonic() - started < profile.soak_minutes * 60:
        i = len(rounds)
        dataset, seeded = SOAK_DATASETS[i % len(SOAK_DATASETS)], replace(profile, seed=profile.seed + 1 + i)
        run["say"](f"{run['name']}: soak round {i + 1} ({dataset}), {(time.monotonic() - started) / 60:.1f} of "
                   f"{profile.soak_minutes:g} min")  # fmt: skip
        items = mixed.bodies(seeded.seed, run["vocab"], profile.input_tokens, profile.output_tokens)
        result = run_fault("abort", pd, seeded, run, dataset, f"{run['name']}-soak{i}",
                           beside=lambda: mixed.send(post_json, lambda body: pd.generate_direct(body)[1], pd.url,
                                                     run["reference_url"], items, 300))  # fmt: skip
        result["beside"] = mixed.judge(result.get("beside") or [], post_json, run["reference_url"])
        result["passed"] = result["passed"] and mixed.passed(result["beside"], len(items))
        rounds.append({**result, "round": i, "dataset": dataset, "at_s": round(time.monotonic() - started, 1)})
        _say_outcome(run["say"], result)


def _into(out: dict, key: str, work: Callable[[], object]) -> None:
    """``out[key] = work()``, or its error as ``out[key + "_error"]`` (a thread's result)."""
    try:
        out[key] = work()
    except Exception as exc:  # recorded; the caller's verdict fails without the result
        out[f"{key}_error"] = f"{type(exc).__name__}: {exc}"[:500]


def _say_outcome(say, f: dict) -> None:
    say(f"  answered {f['answered']} (drafted {f['drafted']}), failed {f['failed']}, wrong {f['wrong']}, "
        f"hung {f['hung']}, slots / rows / rooms held {f['slots_held']} / {f['rows_held']} / {f['rooms_held']}, "
        f"memory x{f['memory_ratio']} ({f['rss_mib']:.0f} MiB), "
        f"serves after: {f['serves_after']}"
        + (f"; other kinds: {f['beside']['answered']} of {f['beside']['requests']} answered, "
           f"{f['beside']['wrong']} wrong" if "beside" in f else "")
        + f" -> {'pass' if f['passed'] else 'FAIL'}")  # fmt: skip


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.from_json:
        print(markdown(json.loads(args.from_json.read_text())))
        return 0
    profile = profile_of(args)
    if "mooncake" in profile.transports and not inside_namespace(os.environ):
        return subprocess.call(isolated([sys.executable, str(Path(__file__).resolve()), *argv]))
    from lynx_deploy.models import prepare_smollm2
    from transformers import AutoTokenizer

    model = prepare_smollm2()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "logs").mkdir(exist_ok=True)
    started = time.monotonic()

    def say(text: str) -> None:
        print(f"[{time.monotonic() - started:6.0f}s] {text}", flush=True)

    vocab = json.loads((model / "config.json").read_text())["vocab_size"]
    commit = provenance.commit(Path(__file__).parent)  # the code this run imported
    earlier = json.loads(args.add_to.read_text()) if args.add_to else None
    path = args.add_to or args.out / "fault_load.json"
    say("starting the int8 reference server")
    with reference_server(model, args.out / "logs") as reference:
        judge = Judge(server_continuation(post_json, reference.url), encode=AutoTokenizer.from_pretrained(str(model)).encode)
        ctx = {"model": model, "vocab": vocab, "judge": judge, "out": args.out, "say": say, "reference_url": reference.url}
        deployments = []
        for transport, prefills in profile.deployments():
            begun = time.monotonic()
            deployments.append(run_deployment(transport, prefills, profile, ctx))
            deployments[-1].update(commit=commit, date=time.strftime("%Y-%m-%d"), wall_s=round(time.monotonic() - begun))
            result = merged(earlier, profile, deployments)
            path.write_text(json.dumps(result, indent=1, default=list) + "\n")  # so far
    print(markdown(result))
    say(f"wrote {path}")
    return 0 if all(passed_deployment(d, profile) for d in deployments) else 1


def merged(earlier: dict | None, profile: Profile, deployments: list[dict]) -> dict:
    """This run's deployments, after those of `earlier` (a result of the same load settings) that it did not rerun."""
    settings = {k: v for k, v in profile.__dict__.items() if k not in ("transports", "prefills")}
    kept = []
    if earlier is not None:
        before = {k: v for k, v in earlier["profile"].items() if k not in ("transports", "prefills")}
        if json.loads(json.dumps(before)) != json.loads(json.dumps(settings, default=list)):
            raise SystemExit(f"--add-to: that result's settings differ from this run's: {before} vs {settings}")
        ran = {(d["transport"], d["prefills"]) for d in deployments}
        kept = [d for d in earlier["deployments"] if (d["transport"], d["prefills"]) not in ran]
    every = [*kept, *deployments]
    return {"profile": {**settings, "transports": sorted({d["transport"] for d in every}),
                        "prefills": sorted({d["prefills"] for d in every})},
            "date": max(d["date"] for d in every), "commit": ", ".join(dict.fromkeys(d["commit"] for d in every)),
            "wall_s": sum(d["wall_s"] for d in every), "deployments": every}  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
