"""The deployments shared by the PD tests (one run of each deployment per session); their requests are `pd_suites`.

Servers compute in fp32 with a bf16 KV cache (`CPU_MODEL_ARGS`: this CPU runs bf16
matmuls ~6x slower than fp32), so the KV that crosses the link is bf16.
Requests are sent through SGLang's router as native `/generate` calls, which
return token ids and `meta_info` (Lynx metrics; references also the top-`TOP_LOGPROBS`
logprobs per output position). Every answer carries its request (`pd_judging.annotate`),
and a reference deployment names the single server that continues its answers after a
near tie (`Deployment.continuation`).
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import sys
import threading
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path

from lynx_deploy.deployment import SERVED_MODEL, PDDeployment
from lynx_deploy.processes import post_json
from lynx_deploy.server import CPU_MODEL_ARGS, SGLangServer
from lynx_testing.netns import INSIDE_ENV, run_isolated
from lynx_deploy.streaming import sse_events
from pd_judging import ContinuationServers, annotate
from server_state import lynx_state, wait_lynx_state
from pd_suites import MAX_TOKENS
from request_types import CHAT_ROOM

SLOW_LINK = ("--lynx-link-gbps", "0.03")  # sent whole after the prefill, the residual lands several decode steps late
# The default path (segments of 512 tokens, each layer sent as the forward writes it) sends the KV while
# the prefill computes, so a residual lags its anchor only where the link is slower than the prefill
# makes KV (int8 KV of SmolLM2 at this CPU's ~190 tokens/s: ~0.018 Gbit/s). At this rate part of a
# prompt's residual is still to send when its prefill ends: every request drafts on its anchor.
DRAFT_LINK = ("--lynx-link-gbps", "0.015")
INT8_LOOPBACK = ("--lynx-mode", "int8", "--lynx-loopback")
# The decode radix cache, on a link slow enough that a request still decodes on its anchor when
# the next one with its prompt arrives.
RADIX_ARGS = ("--lynx-link-gbps", "0.01", "--disaggregation-decode-enable-radix-cache")
# A short prompt's residual (~0.23 MB) lands ~0.6 s after its anchor: several decode steps.
DISTRIBUTION_LINK = ("--lynx-link-gbps", "0.003")
MOONCAKE = ("--lynx-transport", "mooncake")
TOP_LOGPROBS = 20  # what references report per output position


@dataclass(frozen=True)
class Deployment:
    name: str
    lynx_args: tuple[str, ...]
    single: bool = False  # a non-disaggregated server instead of a PD pair
    suites: tuple[str, ...] = ("greedy",)
    extended_suites: tuple[str, ...] = ()  # run only in the extended tier
    reference: bool = False  # request top logprobs (a reference must not change what it decodes)
    isolated: bool = False  # run in a private network namespace (Mooncake listens on every interface)
    extended: bool = False  # only the extended tier starts it
    # A reference's twin: the `--lynx` arguments of one server that decodes greedily exactly as this
    # deployment (the test of each pairing proves it); it continues the reference after a near tie.
    continuation: tuple[str, ...] | None = None


TWO_SIX_LOOPBACK = ("--lynx-mode", "lynx", "--lynx-preset", "2+6", "--lynx-loopback")


def _pages(mode: str, page: int, *args: str, **fields) -> Deployment:
    """A `mode` pair with KV pages of `page` tokens (the page-size matrix, compared to page 1)."""
    return Deployment(f"{mode}-page{page}", ("--lynx-mode", mode, "--page-size", str(page), *args), **fields)


DEPLOYMENTS = (
    Deployment("single", (), single=True),
    Deployment("single-int8-loopback", INT8_LOOPBACK, single=True),
    # int4 is int8's one-stream path with another preset: the default tier's representative is int8.
    Deployment("single-int4-loopback", ("--lynx-mode", "int4", "--lynx-loopback"), single=True, suites=("short",),
               extended=True),
    # What lynx mode with a 2-bit anchor decodes once verified: the 2+6 grid, not int8's 4+4.
    Deployment(
        "single-2+6-loopback", TWO_SIX_LOOPBACK, single=True, reference=True, continuation=TWO_SIX_LOOPBACK
    ),
    Deployment("bf16", ("--lynx-mode", "bf16"), reference=True, continuation=()),
    Deployment(
        "int8",
        ("--lynx-mode", "int8"),
        suites=("greedy", "stops", "sampling", "types", "pages", "faults", "mixed"),
        extended_suites=("distribution",),
        reference=True,
        continuation=INT8_LOOPBACK,
    ),
    Deployment("int4", ("--lynx-mode", "int4"), suites=("short",), reference=True, extended=True,
               continuation=("--lynx-mode", "int4", "--lynx-loopback")),  # fmt: skip
    # The default path: segments, each layer sent as the prefill writes it, data-thread upgrades.
    Deployment(
        "lynx",
        ("--lynx-mode", "lynx", *DRAFT_LINK, "--enable-metrics"),
        suites=("greedy", "stops", "sampling", "sampling-again", "concurrent", "openai", "types"),
    ),
    # Short sampled requests on a link so slow that each residual lands several decode
    # steps after its anchor, so every one of them drafts on its anchor.
    Deployment("lynx-distribution", ("--lynx-mode", "lynx", *DISTRIBUTION_LINK), suites=(),
               extended_suites=("distribution",), extended=True),
    Deployment("bf16-types", ("--lynx-mode", "bf16"), suites=("types",), extended=True),
    Deployment("int4-types", ("--lynx-mode", "int4"), suites=("types",), extended=True),
    # Rollbacks (a 2-bit anchor) with KV pages of 16: only whole pages past the kept tokens go back.
    # The default tier's whole-send deployment: the KV goes after the prefill (--lynx-segment-tokens
    # 0), so each residual lands ~1 s after its anchor whatever the prefill's speed.
    Deployment(
        "lynx-2+6-page16",
        ("--lynx-mode", "lynx", "--lynx-preset", "2+6", "--page-size", "16", *SLOW_LINK, "--lynx-segment-tokens", "0"),
    ),
    # The decode radix cache with pages of 64 (the default tier's page-size pair): partial last
    # pages, transfers starting after cached pages, requests drafting on their anchors.
    Deployment(
        "lynx-page64-radix",
        ("--lynx-mode", "lynx", "--page-size", "64", *RADIX_ARGS),
        suites=("radix", "pages"),
        extended_suites=("greedy",),
    ),
    # The rest of the page-size matrix: each mode at pages of 16 and 64 against the same mode at 1.
    *(_pages(m, p, suites=("greedy",), extended=True) for m in ("bf16", "int8") for p in (16, 64)),
    *(_pages("int4", p, suites=("short",), extended=True) for p in (16, 64)),
    Deployment(
        "lynx-page16-radix",
        ("--lynx-mode", "lynx", "--page-size", "16", "--disaggregation-decode-enable-radix-cache", *DRAFT_LINK),
        suites=("pages", "greedy"),
        extended=True,
    ),
    Deployment("lynx-radix", ("--lynx-mode", "lynx", *RADIX_ARGS), suites=("radix",), extended=True),
    Deployment("lynx-bf16-exact", ("--lynx-mode", "lynx", "--lynx-preset", "bf16-exact", *SLOW_LINK), extended=True),
    Deployment("int8-mooncake", ("--lynx-mode", "int8", *MOONCAKE), isolated=True, extended=True),
    Deployment("lynx-mooncake", ("--lynx-mode", "lynx", *SLOW_LINK, *MOONCAKE), isolated=True),
    Deployment("bf16-mooncake", ("--lynx-mode", "bf16", *MOONCAKE), isolated=True, extended=True),
    Deployment("int4-mooncake", ("--lynx-mode", "int4", *MOONCAKE), suites=("short",), isolated=True, extended=True),
)


# Qwen2.5-Coder-0.5B (Qwen2: q/k/v biases, 14 query heads over 2 KV heads) through a pair. SGLang
# sizes the KV pool against memory available machine-wide before the weights load and refuses to
# start when its 2.5 GB of fp32 weights take more than 1 - fraction of it (--max-total-tokens still
# bounds the pool).
QWEN2_MEMORY = ("--mem-fraction-static", "0.8")
# Qwen2's prefill makes its (smaller: 2 KV heads, 24 layers) KV ~4x slower than SmolLM2's: the default
# path drafts only on a link this slow.
QWEN2_DRAFT_LINK = ("--lynx-link-gbps", "0.003")
QWEN2_DEPLOYMENTS = (
    Deployment("qwen2-lynx", ("--lynx-mode", "lynx", *QWEN2_DRAFT_LINK, *QWEN2_MEMORY), suites=("brief",)),
    # What int8 mode (and lynx mode once verified) decodes, from one server: a pair's reference.
    Deployment("qwen2-single-int8-loopback", (*INT8_LOOPBACK, *QWEN2_MEMORY),
               single=True, suites=("brief",), reference=True, continuation=(*INT8_LOOPBACK, *QWEN2_MEMORY)),  # fmt: skip
    Deployment("qwen2-single", QWEN2_MEMORY, single=True, suites=("brief",), reference=True, extended=True,
               continuation=QWEN2_MEMORY),  # fmt: skip
    Deployment("qwen2-single-int4-loopback", ("--lynx-mode", "int4", "--lynx-loopback", *QWEN2_MEMORY),
               single=True, suites=("brief",), extended=True),  # fmt: skip
    *(Deployment(f"qwen2-{m}", ("--lynx-mode", m, *QWEN2_MEMORY), suites=("brief",), extended=True)
      for m in ("bf16", "int8", "int4")),  # fmt: skip
)


@dataclass
class Run:
    """What one deployment answered, per suite, plus its decode server's free KV before/after."""

    outputs: dict[str, list[dict]] = field(default_factory=dict)
    free_before: dict | None = None
    free_after: dict | None = None
    decode_metrics: str = ""  # the decode server's Prometheus text (with --enable-metrics)
    prefill_metrics: str = ""  # the prefill server's


class LazyRuns:
    """Deployment name -> `Run`, each deployment started the first time a test needs it; every answer
    annotated with its request (`pd_judging.annotate`). `continuation(name)` gives the URL of a
    server continuing deployment `name`'s answers (started when first called: after a near tie)."""

    def __init__(
        self, model_path, bodies: dict, log_dir, secret_file, extended: bool = False, deployments=DEPLOYMENTS
    ) -> None:
        self._args = (model_path, bodies, log_dir, secret_file)
        self.extended = extended
        self._runs: dict[str, Run] = {}
        self._by_name = {d.name: d for d in deployments}
        self._tokenizer = None
        self.continuations = ContinuationServers(model_path, log_dir)

    def __getitem__(self, name: str) -> Run:
        if name not in self._runs:
            self.continuations.close()  # one deployment at a time
            run = run_deployment(self._by_name[name], *self._args, extended=self.extended)
            self._annotate(run)
            self._runs[name] = run
        return self._runs[name]

    def continuation(self, name: str):
        """A callable giving the URL of the server that continues deployment `name`'s answers."""
        args = self._by_name[name].continuation
        if args is None:
            raise ValueError(f"deployment {name} names no continuation server")
        return lambda: self.continuations.url(args)

    def close(self) -> None:
        self.continuations.close()

    def _annotate(self, run: Run) -> None:
        if self._tokenizer is None:
            from transformers import AutoTokenizer

            self._tokenizer = AutoTokenizer.from_pretrained(str(self._args[0]))
        bodies = self._args[1]
        for suite, answers in run.outputs.items():
            suite_bodies = bodies[suite.replace("-again", "")]
            if suite == "radix":
                suite_bodies = suite_bodies * len(answers)
            for body, answer in zip(suite_bodies, answers):
                annotate(answer, body.get("body", body), self._tokenizer.encode)


def run_deployment(dep: Deployment, model_path, bodies: dict, log_dir, secret_file, extended: bool = False) -> Run:
    """Start `dep`, send it its suites (with its extended ones in the extended tier), stop it."""
    if dep.isolated and os.environ.get(INSIDE_ENV) != "1":
        return _run_isolated(dep, model_path, bodies, log_dir, secret_file, extended)
    suites = dep.suites + (dep.extended_suites if extended else ())
    run = Run()
    if dep.single:
        server = SGLangServer(
            model_path,
            ["--lynx", *dep.lynx_args, "--served-model-name", SERVED_MODEL, *CPU_MODEL_ARGS],
            log_path=log_dir / f"{dep.name}.log",
        )
        with server:
            _ask_all(dep, suites, server.url, bodies, run)
        return run
    args = [*dep.lynx_args, "--lynx-secret-file", str(secret_file)]
    radix = "--disaggregation-decode-enable-radix-cache" in dep.lynx_args
    with PDDeployment(model_path, args, extra_args=CPU_MODEL_ARGS, log_dir=log_dir / dep.name) as pd:
        if radix:
            pd.decode.flush_cache()  # the tree keeps cached KV (warm-up's too): count slots without it
        run.free_before = lynx_state(pd.decode)
        _ask_all(dep, suites, pd.url, bodies, run, pd)
        if radix:
            pd.decode.flush_cache()
        free = run.free_before["kv_free_slots"]
        run.free_after = wait_lynx_state(pd.decode, lambda s: s["kv_free_slots"] == free, 30.0)
        if "--enable-metrics" in dep.lynx_args:
            run.decode_metrics = _metrics_text(pd.decode.url)
            run.prefill_metrics = _metrics_text(pd.prefill.url)
    return run


def _metrics_text(url: str) -> str:
    with urllib.request.urlopen(f"{url}/metrics", timeout=30) as resp:
        return resp.read().decode()


def _run_isolated(dep: Deployment, model_path, bodies: dict, log_dir, secret_file, extended: bool) -> Run:
    """`run_deployment` of `dep` in a private network namespace, through this file's command line."""
    folder = Path(log_dir) / dep.name
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "bodies.json").write_text(json.dumps(bodies))
    command = [sys.executable, __file__, dep.name, str(model_path), str(folder / "bodies.json"), str(log_dir),
               str(secret_file), str(folder / "run.json"), "extended" if extended else "default"]  # fmt: skip
    result = run_isolated(command, capture_output=True, text=True, timeout=3600)
    if result.returncode != 0:
        raise RuntimeError(f"deployment {dep.name} failed in its namespace:\n{result.stderr[-3000:]}")
    return Run(**json.loads((folder / "run.json").read_text()))


def _ask_all(dep: Deployment, suites, url: str, bodies: dict, run: Run, pd: PDDeployment | None = None) -> None:
    extra = {"return_logprob": True, "top_logprobs_num": TOP_LOGPROBS} if dep.reference else {}
    for suite in suites:
        if suite == "types":
            run.outputs[suite] = _ask_types(dep, url, pd, bodies[suite], extra)
            continue
        requests = [{**b, **extra} for b in bodies[suite.replace("-again", "")]]
        if suite == "openai":
            answers = [_chat(url, b["messages"]) for b in requests]
        elif suite == "radix":
            answers = _radix_sequence(url, requests[0])
        elif suite in ("concurrent", "distribution", "mixed"):
            # All at once: the prefill computes them together and the link sends every
            # anchor before any residual, so each request drafts on its anchor (sent a few
            # at a time, a short prompt's residual would often land with its anchor).
            with concurrent.futures.ThreadPoolExecutor(len(requests)) as pool:
                answers = list(pool.map(lambda b: post_json(f"{url}/generate", b), requests))
        else:
            answers = [post_json(f"{url}/generate", b) for b in requests]
        run.outputs[suite] = answers


def _ask_types(dep: Deployment, url: str, pd: PDDeployment, types: list[dict], extra: dict) -> list:
    """One answer per request type (the decode server's, or an error text); references one at a
    time, others four at a time (their verify passes then batch several requests)."""

    def ask(kind: dict):
        body = kind["body"] if kind["how"] == "chat" else {**kind["body"], **extra}
        try:
            if kind["how"] == "chat":
                return chat_direct(pd, {"model": SERVED_MODEL, **body}, CHAT_ROOM)
            if kind["how"] == "direct":
                return pd.generate_direct(body)[1]
            return post_json(f"{url}/generate", body)
        except urllib.error.HTTPError as exc:
            return f"HTTP {exc.code}: {exc.read().decode(errors='replace')[:2000]}"

    with concurrent.futures.ThreadPoolExecutor(1 if dep.reference else 4) as pool:
        return list(pool.map(ask, types))


def _radix_sequence(url: str, body: dict) -> list[dict]:
    """Same prompt three times: A, then B while A decodes on its anchor, then C after A finished.

    With the decode radix cache on, B must not reuse A's anchor-precision
    prompt KV (it transfers the whole prompt); C reuses A's verified KV.
    """
    first_token = threading.Event()
    answers: dict[str, dict] = {}

    def stream_a():
        final = {}
        for event in sse_events(f"{url}/generate", body):
            final = event
            if event.get("meta_info", {}).get("completion_tokens", 0) >= 1:
                first_token.set()
        answers["A"] = final

    thread = threading.Thread(target=stream_a)
    thread.start()
    first_token.wait(timeout=600)
    answers["B"] = post_json(f"{url}/generate", body)
    thread.join(timeout=600)
    answers["C"] = post_json(f"{url}/generate", body)
    return [answers["A"], answers["B"], answers["C"]]


def chat_direct(pd: PDDeployment, body: dict, room: int) -> dict:
    """An OpenAI chat completion sent to both servers with bootstrap room `room` (the decode server's
    answer): the same room in every deployment gives the samples of an ``n > 1`` request the same seeds."""
    fields = pd.bootstrap_fields(room)
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        answers = [pool.submit(post_json, f"{server.url}/v1/chat/completions", {**body, **fields})
                   for server in (pd.prefill, pd.decode)]  # fmt: skip
        return [a.result() for a in answers][1]


def _chat(url: str, messages: list) -> dict:
    from openai import OpenAI

    reply = OpenAI(base_url=f"{url}/v1", api_key="unused", timeout=600).chat.completions.create(
        model=SERVED_MODEL, messages=messages, max_tokens=MAX_TOKENS, temperature=0
    )
    return {"text": reply.choices[0].message.content, "finish_reason": reply.choices[0].finish_reason}


if __name__ == "__main__":
    # python pd_scenarios.py NAME MODEL BODIES_JSON LOG_DIR SECRET_FILE OUT_JSON TIER (see `_run_isolated`)
    name, model, bodies_file, logs, secret, out, tier = sys.argv[1:8]
    chosen = next(d for d in DEPLOYMENTS if d.name == name)
    bodies = json.loads(Path(bodies_file).read_text())
    result = run_deployment(chosen, model, bodies, Path(logs), secret, extended=tier == "extended")
    Path(out).write_text(json.dumps(asdict(result)))
