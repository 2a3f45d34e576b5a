"""Extended tier (`--extended`): a bounded soak through the router, and the slow faults.

* Soak: `SOAK_REQUESTS` requests of mixed lengths and types, `CONCURRENCY` at a
  time, through SGLang's router, every `ABORT_EVERY`-th client hanging up
  after its first event; once in `int8` mode and once in `lynx` mode. No error
  but the aborts, no leaked slot or room, and every `lynx` answer judged
  against `int8` mode's answer to the same request (greedy: near ties, then
  int8 continued from lynx's prefix on a loopback server; seeded samples: the
  seeded near-tie rule): a wrong answer fails. Lynx's CPU and memory per
  request are reported against `int8` mode's (`soak-report.json` in the
  server logs, with the date and commit; `docs/results/pd_soak.json` is one).
* A decode server restarted while the prefill sends to it.
* A prompt whose prefill takes minutes while short requests keep flowing
  through the router.

Their cheap representatives run in the default tier (`test_pd_failures.py`).
"""

from __future__ import annotations

import concurrent.futures
import json
import secrets
import threading
import time
from pathlib import Path

import psutil
import pytest
from lynx_deploy.deployment import PDDeployment, new_room
from lynx_deploy.processes import post_json
from lynx_deploy.server import CPU_MODEL_ARGS, SGLangServer
from lynx_testing import provenance
from lynx_testing.judge import Tally
from lynx_deploy.streaming import abandon
from pd_judging import ContinuationServers, annotate, judge_answers, judge_seeded
from pd_scenarios import INT8_LOOPBACK, TOP_LOGPROBS
from pd_suites import mixed_load, request_body
from server_state import lynx_state, wait_lynx_state

pytestmark = [pytest.mark.server, pytest.mark.extended]

SOAK_REQUESTS = 200
CONCURRENCY = 16
ABORT_EVERY = 10
# A short request whose answer is 4 tokens whatever the model says (a sampled one may end at EOS at once).
SHORT = {"text": "Say hello.", "sampling_params": {"max_new_tokens": 4, "temperature": 0, "ignore_eos": True}}


def _served(answer) -> bool:
    return isinstance(answer, dict) and answer["meta_info"]["completion_tokens"] == 4


@pytest.fixture(scope="module")
def tokenizer(model_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model_path))


@pytest.fixture(scope="module")
def secret_file(server_logs):
    path = server_logs / "soak-secret"
    path.write_text(secrets.token_hex(32))
    return path


def _wait(server: SGLangServer, ready, wait_s: float = 120.0) -> dict:
    return wait_lynx_state(server, ready, wait_s)


def _usage(server: SGLangServer) -> tuple[float, int]:
    """CPU seconds and resident bytes of a server's whole process tree."""
    root = psutil.Process(server.process.pid)
    procs = [root, *root.children(recursive=True)]
    cpu = sum(p.cpu_times().user + p.cpu_times().system for p in procs)
    return cpu, sum(p.memory_info().rss for p in procs)


def _soak(mode: str, model_path, tokenizer, secret_file, log_dir) -> dict:
    logprobs = {"return_logprob": True, "top_logprobs_num": TOP_LOGPROBS}  # the reference's, asked in both modes
    bodies = [{**b, **logprobs} for b in mixed_load(tokenizer, SOAK_REQUESTS)]
    args = ["--lynx-mode", mode, "--lynx-link-gbps", "0.2", "--lynx-secret-file", str(secret_file)]
    with PDDeployment(model_path, args, extra_args=CPU_MODEL_ARGS, log_dir=log_dir / f"soak-{mode}") as pd:
        free = lynx_state(pd.decode)["kv_free_slots"]
        before = {name: _usage(server) for name, server in (("prefill", pd.prefill), ("decode", pd.decode))}
        started = time.monotonic()

        def one(item):
            index, body = item
            if index % ABORT_EVERY == ABORT_EVERY - 1:
                return "aborted", abandon(f"{pd.url}/generate", body)
            try:
                return "answered", post_json(f"{pd.url}/generate", body, timeout=1800)
            except OSError as exc:
                return "error", str(exc)

        with concurrent.futures.ThreadPoolExecutor(CONCURRENCY) as pool:
            results = list(pool.map(one, enumerate(bodies)))
        elapsed = time.monotonic() - started
        after = {name: _usage(server) for name, server in (("prefill", pd.prefill), ("decode", pd.decode))}
        decode_state = _wait(pd.decode, lambda s: s["kv_free_slots"] == free and s["transfer_rooms"] == 0)
        prefill_state = _wait(pd.prefill, lambda s: s["transfer_rooms"] == 0)
    errors = [answer for kind, answer in results if kind == "error"]
    answered = [answer for kind, answer in results if kind == "answered"]
    return {
        "mode": mode,
        "requests": len(bodies),
        "answered": len(answered),
        "aborted": sum(kind == "aborted" for kind, _ in results),
        "errors": errors,
        "bad_answers": [a for a in answered if a["meta_info"]["finish_reason"]["type"] not in ("length", "stop")],
        "answers": {i: answer for i, (kind, answer) in enumerate(results) if kind == "answered"},
        "bodies": bodies,
        "seconds": round(elapsed, 1),
        "kv_slots_leaked": free - decode_state["kv_free_slots"],
        "rooms_left": decode_state["transfer_rooms"] + prefill_state["transfer_rooms"],
        "cpu_s_per_request": {k: round((after[k][0] - before[k][0]) / len(bodies), 4) for k in after},
        "rss_growth_mib": {k: round((after[k][1] - before[k][1]) / 2**20, 1) for k in after},
        "rss_mib": {k: round(after[k][1] / 2**20, 1) for k in after},
    }


def test_a_bounded_soak_through_the_router_errs_only_where_clients_left_and_leaks_nothing(
    model_path, tokenizer, secret_file, server_logs
):
    reports = [_soak(mode, model_path, tokenizer, secret_file, server_logs) for mode in ("int8", "lynx")]
    answers = [(r.pop("answers"), r.pop("bodies")) for r in reports]
    for report in reports:
        assert report["errors"] == [] and report["bad_answers"] == [], report
        assert report["answered"] + report["aborted"] == SOAK_REQUESTS
        assert report["kv_slots_leaked"] == 0 and report["rooms_left"] == 0, report
    int8, lynx = reports
    judged = _judge_soak(answers[1][0], answers[0][0], answers[0][1], model_path, tokenizer, server_logs)
    lynx["judged"] = judged.as_dict()
    overhead = {
        side: round(lynx["cpu_s_per_request"][side] - int8["cpu_s_per_request"][side], 4) for side in ("prefill", "decode")
    }
    commit = provenance.commit(Path(__file__).parent)
    summary = {"date": time.strftime("%Y-%m-%d"), "commit": commit, "runs": reports,
               "lynx_minus_int8_cpu_s_per_request": overhead}  # fmt: skip
    (server_logs / "soak-report.json").write_text(json.dumps(summary, indent=2))
    print("\nsoak:", json.dumps(summary))
    print(f"\nsoak lynx vs int8: {judged.summary()}")
    assert judged.ok, f"wrong answers: {[p for p in judged.partings if p.kind == 'mismatch']}"


def _judge_soak(lynx: dict, int8: dict, bodies: list[dict], model_path, tokenizer, log_dir) -> Tally:
    """Every answered lynx request against int8's answer to it (requests int8 did not answer count as
    without a reference, which fails the judgement)."""
    vocab = json.loads((model_path / "config.json").read_text())["vocab_size"]
    servers = ContinuationServers(model_path, log_dir)
    tally = Tally()
    try:
        for i, answer in sorted(lynx.items()):
            if i not in int8:
                tally.answers, tally.unmatched = tally.answers + 1, tally.unmatched + 1
                continue
            seed = bodies[i]["sampling_params"].get("sampling_seed")
            if seed is not None:
                tally.add(judge_seeded(int8[i], answer, seed, vocab, i))
                continue
            annotate(int8[i], bodies[i], tokenizer.encode)
            tally.add(judge_answers([int8[i]], [answer], lambda: servers.url(INT8_LOOPBACK), first_index=i))
    finally:
        servers.close()
    return tally


def test_a_decode_server_restarted_mid_transfer_leaves_the_prefill_serving(model_path, tokenizer, secret_file, server_logs):
    args = ["--lynx-mode", "int8", "--lynx-link-gbps", "0.002", "--lynx-secret-file", str(secret_file)]
    with PDDeployment(model_path, args, extra_args=CPU_MODEL_ARGS, log_dir=server_logs / "pd-restart") as pd:
        room = new_room()

        def restart_decode():
            _wait(pd.decode, lambda s: s["rooms_by_state"].get("receiving"))
            pd.decode.stop(grace=0)

        answers = pd.generate_direct(request_body(tokenizer, 1024), room, after_prefill=restart_decode)
        assert isinstance(answers[1], str), "the request on the killed decode server cannot succeed"
        pd.decode = SGLangServer(
            model_path, pd.decode.command[pd.decode.command.index("--lynx") :], log_path=server_logs / "pd-restart" / "decode-2.log"
        )
        pd.decode.start().wait_ready()
        # The prefill gives up on the dead peer (30 s without it taking data) and serves on.
        prefill = _wait(pd.prefill, lambda s: s["rooms_by_state"]["queued_bytes"] == 0, wait_s=180)
        assert prefill["rooms_by_state"]["queued_bytes"] == 0, prefill
        _, decode = pd.generate_direct(SHORT, room + 1)
        assert _served(decode), decode


def test_a_prefill_of_minutes_does_not_stop_short_requests_through_the_router(model_path, tokenizer, secret_file, server_logs):
    args = ["--lynx-mode", "lynx", "--lynx-secret-file", str(secret_file)]
    with PDDeployment(model_path, args, extra_args=CPU_MODEL_ARGS, log_dir=server_logs / "pd-long") as pd:
        long_answer = {}
        worker = threading.Thread(
            target=lambda: long_answer.update(post_json(f"{pd.url}/generate", request_body(tokenizer, 7500), timeout=3600))
        )
        started = time.monotonic()
        worker.start()
        short = []
        while worker.is_alive() and len(short) < 10:
            short.append(post_json(f"{pd.url}/generate", SHORT))
        worker.join(timeout=3600)
        print(f"\nlong prefill: {time.monotonic() - started:.0f} s, {len(short)} short requests meanwhile")
        assert long_answer.get("meta_info", {}).get("completion_tokens", 0) >= 1, long_answer
        assert short and all(_served(a) for a in short), short
