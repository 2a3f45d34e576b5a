"""CPU a decode server spends while its requests wait for KV, per mode, on the real prefill/decode pair.

For every mode a fresh deployment (prefill + decode with --lynx and SGLang's
router) is started and, after a warm-up request, three windows are measured
on the decode server (every process of it, and its scheduler alone):

* ``idle``: nothing in flight;
* ``waiting``: `--requests` requests sent through the router while the
  prefill server's scheduler is stopped (SIGSTOP): the decode server has
  reserved their KV and waits for it, which is what a decode server does
  during a long prefill or a slow transfer;
* then the prefill resumes and every request must complete (checked).

CPU is the processes' user+system seconds over the window divided by its
length: 1.0 is one core busy.

    python benchmark/idle_cpu.py --modes lynx,int8 --window-s 20
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import statistics
import sys
import threading
import time
from pathlib import Path

import psutil
from lynx_deploy.models import prepare_smollm2
from lynx_deploy.deployment import PDDeployment
from lynx_deploy.processes import post_json, process_tree
from lynx_deploy.server import CPU_MODEL_ARGS, SGLangServer
from lynx_testing import provenance
from lynx_testing.prompts import chat_prompt, long_question

import doc_markdown as md


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--modes", default="lynx,int8", help="comma-separated --lynx-mode values")
    parser.add_argument("--window-s", type=float, default=20.0, help="length of each measured window")
    parser.add_argument("--requests", type=int, default=4, help="requests waiting for KV in the waiting window")
    parser.add_argument("--prompt-tokens", type=int, default=1024)
    parser.add_argument("--json", default="results/idle_cpu.json", help="where the rows go")
    parser.add_argument("--log-dir", default="results/idle_cpu_logs")
    return parser.parse_args(argv)


def cpu_seconds(processes: list[psutil.Process]) -> float:
    """User + system CPU seconds of `processes` so far (a process gone meanwhile counts nothing)."""
    total = 0.0
    for process in processes:
        try:
            times = process.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += times.user + times.system
    return total


def measure(server: SGLangServer, window_s: float) -> dict:
    """Cores used by the server (all processes) and by its scheduler over one window."""
    everything = process_tree(server.process.pid)
    scheduler = [psutil.Process(pid) for pid in server.scheduler_pids()]
    start_all, start_sched, started = cpu_seconds(everything), cpu_seconds(scheduler), time.monotonic()
    time.sleep(window_s)
    wall = time.monotonic() - started
    return {
        "server_cores": (cpu_seconds(everything) - start_all) / wall,
        "scheduler_cores": (cpu_seconds(scheduler) - start_sched) / wall,
        "window_s": wall,
    }


def _wait_reserved(decode: SGLangServer, count: int, timeout_s: float = 120.0) -> int:
    """Wait until the decode server holds `count` transfer rooms; returns how many it holds."""
    deadline = time.monotonic() + timeout_s
    rooms = 0
    while time.monotonic() < deadline:
        states = decode.get_json("/server_info", quiet=True)["internal_states"]
        rooms = sum(state.get("lynx", {}).get("transfer_rooms", 0) for state in states)
        if rooms >= count:
            return rooms
        time.sleep(0.5)
    return rooms


def run_mode(mode: str, model_path: Path, tokenizer, args, secret_file: Path) -> dict:
    log_dir = Path(args.log_dir) / mode
    lynx_args = ["--lynx-mode", mode, "--lynx-secret-file", str(secret_file), "--lynx-transfer-timeout", "600"]
    with PDDeployment(model_path, lynx_args, extra_args=CPU_MODEL_ARGS, log_dir=log_dir) as pd:
        def body(index: int) -> dict:
            text = chat_prompt(tokenizer, long_question(tokenizer, args.prompt_tokens, index))
            return {"text": text, "sampling_params": {"max_new_tokens": 8, "temperature": 0}}

        post_json(f"{pd.url}/generate", body(0))  # warm-up
        time.sleep(2.0)
        idle = measure(pd.decode, args.window_s)
        (scheduler,) = pd.prefill.scheduler_pids()
        answers: list = []
        os.kill(scheduler, signal.SIGSTOP)
        try:
            threads = [
                threading.Thread(target=lambda i=i: answers.append(post_json(f"{pd.url}/generate", body(i + 1))))
                for i in range(args.requests)
            ]
            for thread in threads:
                thread.start()
            reserved = _wait_reserved(pd.decode, args.requests)
            waiting = measure(pd.decode, args.window_s)
        finally:
            os.kill(scheduler, signal.SIGCONT)
        for thread in threads:
            thread.join(timeout=600)
        completed = sum(1 for a in answers if isinstance(a, dict) and a.get("output_ids"))
    return {"mode": mode, "idle": idle, "waiting": waiting, "rooms_waiting": reserved,
            "requests": args.requests, "completed": completed}  # fmt: skip


def main(argv=None) -> int:
    args = parse_args(argv)
    from transformers import AutoTokenizer

    model_path = prepare_smollm2()
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    secret_file = Path(args.log_dir) / "secret"
    secret_file.parent.mkdir(parents=True, exist_ok=True)
    secret_file.write_text(secrets.token_hex(32))
    rows = []
    for mode in [m.strip() for m in args.modes.split(",") if m.strip()]:
        print(f"{mode}: starting the pair", file=sys.stderr, flush=True)
        row = run_mode(mode, model_path, tokenizer, args, secret_file)
        rows.append(row)
        print(
            f"{mode:5}  idle: server {row['idle']['server_cores']:.3f} cores, scheduler "
            f"{row['idle']['scheduler_cores']:.3f}  |  {row['rooms_waiting']} rooms waiting for KV: server "
            f"{row['waiting']['server_cores']:.3f}, scheduler {row['waiting']['scheduler_cores']:.3f}  |  "
            f"{row['completed']}/{row['requests']} completed after the prefill resumed",
            flush=True,
        )
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    stamp = {"date": time.strftime("%Y-%m-%d"), "commit": provenance.commit(Path(__file__).parent),
             "window_s": args.window_s, "prompt_tokens": args.prompt_tokens}  # fmt: skip
    document = {**stamp, "rows": rows, "load_at_end": os.getloadavg()}
    Path(args.json).write_text(json.dumps(document, indent=1))
    print(markdown(document))
    worst = max(row["waiting"]["scheduler_cores"] for row in rows)
    print(f"largest scheduler share while waiting: {worst:.3f} cores (median of modes "
          f"{statistics.median(r['waiting']['scheduler_cores'] for r in rows):.3f})")  # fmt: skip
    return 0 if all(row["completed"] == row["requests"] for row in rows) else 1


def markdown(document: dict) -> str:
    """The docs' table (`scripts/doc_tables.py`): per mode the decode server's CPU, all its processes
    and its scheduler alone, idle and with requests waiting for KV, and how many completed after."""
    lines = [f"{document['date']}, commit {document['commit']}: {document['window_s']:g} s windows, prompts of "
             f"{document['prompt_tokens']:,} tokens; cores (1.0 is one core busy), server / scheduler:", "",
             *md.head(["mode", "idle", "requests waiting for KV", "waiting", "completed after"])]  # fmt: skip
    for row in document["rows"]:
        idle, waiting = row["idle"], row["waiting"]
        lines.append(md.line([f"`{row['mode']}`", f"{idle['server_cores']:.3f} / {idle['scheduler_cores']:.3f}",
                              str(row["rooms_waiting"]), f"{waiting['server_cores']:.3f} / {waiting['scheduler_cores']:.3f}",
                              f"{row['completed']} of {row['requests']}"]))  # fmt: skip
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
