"""bench_serving's command line for each point, run through `capture.py` (one process per deployment)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from load.plan import Point, requests_at

CAPTURE = Path(__file__).with_name("capture.py")
SHARED_PREFIX_GROUPS = 4


def bench_argv(point: Point, url: str, model: Path, rate: float | None, profile, out: Path, trace: Path | None,
               goodput_ms: float | None) -> list[str]:  # fmt: skip
    """bench_serving's options for `point` against the router at `url` (greedy, EOS ignored, top-2 logprobs)."""
    argv = ["--backend", "sglang", "--base-url", url, "--model", "smollm2", "--tokenizer", str(model),
            "--seed", str(profile.seed), "--return-logprob", "--top-logprobs-num", "2", "--warmup-requests", "0",
            "--output-file", str(out), "--disable-tqdm", "--ready-check-timeout-sec", "0"]  # fmt: skip
    if goodput_ms is not None:
        argv += ["--goodput", f"ttft:{goodput_ms:.0f}"]
    if point.dataset == "random-ids":
        argv += ["--dataset-name", "random-ids", "--tokenize-prompt", "--random-input-len", str(profile.input_tokens),
                 "--random-output-len", str(profile.output_tokens), "--random-range-ratio", "1.0",
                 "--num-prompts", str(requests_at(profile, point.load)), "--request-rate", f"{rate:.6f}"]  # fmt: skip
    elif point.dataset == "generated-shared-prefix":
        per_group = max(1, profile.requests // SHARED_PREFIX_GROUPS)
        question = profile.input_tokens // 4
        argv += ["--dataset-name", "generated-shared-prefix", "--gsp-num-groups", str(SHARED_PREFIX_GROUPS),
                 "--gsp-prompts-per-group", str(per_group), "--gsp-system-prompt-len",
                 str(profile.input_tokens - question), "--gsp-question-len", str(question),
                 "--gsp-output-len", str(profile.output_tokens), "--gsp-range-ratio", "1.0",
                 "--num-prompts", str(per_group * SHARED_PREFIX_GROUPS), "--request-rate", f"{rate:.6f}"]  # fmt: skip
    elif point.dataset == "trace":
        argv += ["--dataset-name", "mooncake", "--dataset-path", str(trace), "--use-trace-timestamps",
                 "--mooncake-workload", "conversation", "--num-prompts", str(profile.trace_requests)]  # fmt: skip
    else:
        raise ValueError(f"unknown dataset {point.dataset!r}")
    return argv


def start_points(runs: list[tuple[Point, list[str], Path]], work: Path, log: Path) -> subprocess.Popen:
    """Start bench_serving once per ``(point, argv, records path)``, in order, in one child process
    (its own process group, output appended to `log`)."""
    plan = work / "runs.json"
    plan.write_text(json.dumps([{"records": str(records), "argv": argv} for _, argv, records in runs]))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore::FutureWarning", "HF_HUB_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1"}
    with open(log, "a") as out:
        return subprocess.Popen([sys.executable, str(CAPTURE), str(plan)], stdout=out, stderr=subprocess.STDOUT,
                                env=env, start_new_session=True)  # fmt: skip


def run_points(runs: list[tuple[Point, list[str], Path]], work: Path, log: Path) -> None:
    """Run them (`start_points`) and wait for the last."""
    code = start_points(runs, work, log).wait()
    if code != 0:
        raise RuntimeError(f"bench_serving exited with {code}; see {log}")


def read_result(path: Path) -> dict:
    """bench_serving's result line (the last line of its output file)."""
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    if not lines:
        raise RuntimeError(f"bench_serving wrote no result to {path}")
    return json.loads(lines[-1])


def read_records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
