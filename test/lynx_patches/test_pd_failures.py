"""Faults on a real prefill/decode pair: every request ends with a correct answer or a clear
error, never a wrong one; both servers keep serving; the decode server's KV slots come back.

The shared pair (`slow_pd`) runs `lynx` mode on the default path (segments,
layer streaming) on an emulated link slower than its prefill makes KV (a
2k-token prompt's KV takes ~16 s, longer than the `TIMEOUT_S` no-progress
timeout, so only a real stall trips it; its residual lands seconds after its
anchor), with a small KV pool: the faults hit requests that draft on their
anchors and verify, and every completed request must have drafted. Every
completed answer is judged token by token against `int8` mode's answer to
the same request (the session's `int8` pair, `pd_scenarios`; near ties, then
the reference continued from lynx's prefix: `pd_judging`). Requests go
straight to both servers (`generate_direct`) so a test knows their bootstrap
room. The kill tests share a `lynx`-mode pair (`kill_pd`) whose prefill server they
kill, while it computes the prompt, during the anchor and during the residual, and
restart. What cannot be timed on a real pair (a release during the anchor write,
an abort during encoding, replayed or forged messages) is covered by the unit
tests of both sides (`test/lynx_patches/pd`).

Each scenario's counts (requests, answered, failed with what reason, wrong,
tokens judged, slots held) are written to a JSON where `LYNX_FAULT_RECORD`
names one: `docs/results/pd_failures.json`, the Reliability table of
`docs/SERVING.md` (`scripts/doc_tables.py`).
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import secrets
import time
import signal
import threading
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from lynx.transfer.keys import curve_keys
from lynx.transfer.transport import TransportError
from lynx.transfer.zmq_transport import ZmqTransport
from lynx_deploy.deployment import PDDeployment, new_room
from lynx_deploy.processes import post_json
from lynx_deploy.server import CPU_MODEL_ARGS, SGLangServer
from lynx_testing import provenance
from lynx_testing.judge import Tally
from lynx_deploy.streaming import sse_events
from pd_judging import judge_answers, judge_seeded
from pd_suites import fault_bodies, mixed_load, request_body
from server_state import lynx_state, wait_lynx_state

pytestmark = pytest.mark.server

# 1.9 MB/s: a 2k-token prompt's KV (~25 MB in all) takes ~13 s, longer than its prefill (~9 s here).
SLOW_LINK_GBPS = 0.015
TIMEOUT_S = 8
POOL_TOKENS = 4096
SMALL = {"text": "Say hello.", "sampling_params": {"max_new_tokens": 4, "temperature": 0}}
LONG, LONGER, OTHER = range(3)  # `fault_bodies`: 2k tokens, the same extended, 1k tokens


def _wait_state(server, ready, wait_s: float = 60.0) -> dict:
    return wait_lynx_state(server, ready, wait_s, poll_s=0.2)


def _receiving(state: dict) -> bool:
    return bool(state["rooms_by_state"].get("receiving"))


def _computing(state: dict) -> bool:
    """A room waits for its prefill: reserved, or receiving the layers streamed as they are computed."""
    return bool(state["rooms_by_state"].get("reserved")) or _receiving(state)


def _wait_free(server, want: int, wait_s: float = 60.0) -> int:
    return _wait_state(server, lambda s: s["kv_free_slots"] == want, wait_s)["kv_free_slots"]


def _serves_small_request(pd: PDDeployment) -> None:
    _, decode = pd.generate_direct(SMALL)
    assert isinstance(decode, dict) and decode["text"].strip(), decode


@pytest.fixture(scope="module")
def record():
    """Rows of the Reliability table: each test adds its scenario's counts (`_record`); written to
    the file `LYNX_FAULT_RECORD` names, with the date and commit, once the module's tests ran."""
    rows: list[dict] = []
    yield rows
    path = os.environ.get("LYNX_FAULT_RECORD")
    if path:
        commit = provenance.commit(Path(__file__).parent)
        settings = {"link_gbps": SLOW_LINK_GBPS, "timeout_s": TIMEOUT_S, "pool_tokens": POOL_TOKENS}
        result = {"date": time.strftime("%Y-%m-%d"), "commit": commit, **settings, "rows": rows}
        Path(path).write_text(json.dumps(result, indent=1) + "\n")


def _record(record: list, fault: str, answers: list, tally: Tally | None = None, aborted: int = 0,
            held: int = 0) -> None:  # fmt: skip
    """One scenario's counts: `answers` are the decode server's to the requests whose clients waited
    (a dict answered, text an error), `aborted` more requests ended because their client left, `held`
    slots were still reserved afterwards."""
    failed = [a for a in answers if not isinstance(a, dict)]
    tally = tally or Tally()
    record.append({
        "fault": fault, "requests": len(answers) + aborted, "answered": len(answers) - len(failed),
        "drafted": sum(isinstance(a, dict) and a["meta_info"]["lynx"]["speculative_tokens"] > 0 for a in answers),
        "aborted": aborted, "failed": len(failed), "reasons": sorted({_reason(a) for a in failed}),
        "wrong": tally.wrong + tally.unmatched, "tokens_judged": tally.tokens,
        "near_ties": sum(p.kind == "near_tie" for p in tally.partings), "slots_held": held,
    })  # fmt: skip


def _reason(error) -> str:
    """An error answer's message (SGLang's OpenAI-style `{"object": "error", "message": ...}`)."""
    try:
        error = json.loads(error)["message"]
    except (ValueError, TypeError, KeyError):
        pass
    return str(error).strip()[:1000]


@pytest.fixture(scope="module")
def secret_file(server_logs):
    path = server_logs / "failures-secret"
    path.write_bytes(secrets.token_bytes(32).hex().encode())
    return path


@pytest.fixture(scope="module")
def tokenizer(model_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model_path))


def _body(tokenizer, tokens: int, index: int = 0, max_new_tokens: int = 8) -> dict:
    return request_body(tokenizer, tokens, index, max_new_tokens)


@pytest.fixture(scope="module")
def int8(pd_runs):
    """`int8` mode's answers to the fault bodies and the mixed load, and its continuation server
    (the session's int8 pair runs, and stops, before `slow_pd` starts)."""
    run = pd_runs["int8"]
    return {"faults": run.outputs["faults"], "mixed": run.outputs["mixed"], "url": pd_runs.continuation("int8")}


def _assert_exact_and_drafted(answer, int8: dict, which: int, label: str) -> Tally:
    """A completed lynx answer to fault body `which`: it drafted on its anchor, and every token equals
    int8 mode's (near ties, then int8 continued from its prefix)."""
    assert isinstance(answer, dict), f"{label}: {answer}"
    drafted = answer["meta_info"]["lynx"]["speculative_tokens"]
    tally = judge_answers([int8["faults"][which]], [answer], int8["url"])
    print(f"\n{label}: {tally.summary()}; drafted {drafted}, lynx {answer['meta_info']['lynx']}")
    assert tally.ok, f"{label}: {tally.partings}"
    assert drafted > 0, f"{label}: the request never drafted on its anchor: {answer['meta_info']['lynx']}"
    return tally


@pytest.fixture(scope="module")
def slow_pd(model_path, server_logs, secret_file, int8):
    lynx_args = [
        "--lynx-mode", "lynx",
        "--lynx-link-gbps", str(SLOW_LINK_GBPS),
        "--lynx-transfer-timeout", str(TIMEOUT_S),
        "--lynx-secret-file", str(secret_file),
    ]  # fmt: skip
    with PDDeployment(
        model_path, lynx_args, extra_args=CPU_MODEL_ARGS, max_total_tokens=POOL_TOKENS, log_dir=server_logs / "pd-slow"
    ) as pd:
        pd.free_slots = lynx_state(pd.decode)["kv_free_slots"]
        yield pd


@pytest.fixture(scope="module")
def bodies(tokenizer) -> list[dict]:
    return fault_bodies(tokenizer)


@pytest.fixture(scope="module")
def reference(slow_pd, bodies, int8) -> dict:
    """The 2k-token request answered with no fault (exact, drafted): the body every faulty run sends."""
    _, decode = slow_pd.generate_direct(bodies[LONG])
    tally = _assert_exact_and_drafted(decode, int8, LONG, "no fault")
    return {"body": bodies[LONG], "answer": decode, "tally": tally}


def test_a_transfer_longer_than_the_timeout_succeeds_while_it_keeps_moving(reference, record):
    lynx = reference["answer"]["meta_info"]["lynx"]
    took = lynx["residual_ready_s"] - lynx["manifest_s"]
    _record(record, f"a transfer that takes longer than the timeout ({took:.0f} s) but keeps moving",
            [reference["answer"]], reference["tally"])  # fmt: skip
    assert took > TIMEOUT_S, lynx
    assert reference["answer"]["output_ids"]


def test_a_stalled_link_fails_the_request_after_the_timeout_and_both_keep_serving(slow_pd, reference, record):
    """The prefill's scheduler (which computes and sends the KV) freezes mid-transfer; its
    HTTP and bootstrap servers stay up, so only the no-progress timeout can notice.

    It freezes as soon as the decode side reports the room receiving, i.e. once the first
    layers have crossed, not after the prefill answers: with the KV streamed layer by layer
    most of it has crossed by then, and what is left may already sit in socket buffers."""
    (scheduler,) = slow_pd.prefill.scheduler_pids()
    resumed = threading.Event()
    seen = {}

    def stall_during_transfer():
        seen["before_stall"] = _wait_state(slow_pd.decode, _receiving)
        os.kill(scheduler, signal.SIGSTOP)
        _wait_state(slow_pd.decode, lambda s: not _receiving(s), wait_s=TIMEOUT_S + 60)
        os.kill(scheduler, signal.SIGCONT)
        resumed.set()

    stall = threading.Thread(target=stall_during_transfer, daemon=True)
    stall.start()
    try:
        _, decode = slow_pd.generate_direct(reference["body"])
    finally:
        stall.join(timeout=TIMEOUT_S + 120)
        os.kill(scheduler, signal.SIGCONT)
    assert _receiving(seen["before_stall"]), f"the transfer was never seen receiving: {seen['before_stall']}"
    assert resumed.is_set()
    free = _wait_free(slow_pd.decode, slow_pd.free_slots)
    _record(record, "the prefill's scheduler frozen (SIGSTOP) mid-transfer", [decode], held=slow_pd.free_slots - free)
    assert isinstance(decode, str), "a transfer that stopped moving must fail"
    assert f"made no progress for {TIMEOUT_S}s" in decode and "Traceback" not in decode, decode
    assert free == slow_pd.free_slots
    _serves_small_request(slow_pd)


def test_peers_without_the_secret_cannot_get_a_byte_in_and_the_transfer_is_exact(slow_pd, reference, int8, record):
    state = lynx_state(slow_pd.decode)
    endpoint, dropped = state["data_endpoint"], state["dropped_messages"]
    refused = []

    def attack():
        for curve in (None, curve_keys(secrets.token_bytes(32))):
            with ZmqTransport(send_timeout_s=2, curve=curve) as transport:
                try:
                    transport.send(endpoint, [b"junk"] * 6000)
                except TransportError:
                    refused.append(curve is None)

    _, decode = slow_pd.generate_direct(reference["body"], after_prefill=attack)
    assert refused == [True, False], "both peers must be refused at the handshake"
    tally = _assert_exact_and_drafted(decode, int8, LONG, "secret-less peers")
    _record(record, "two peers without the secret (plaintext; CurveZMQ with a wrong key) each sending a 6,000-part "
            "message during a transfer, both refused at the handshake", [decode], tally)  # fmt: skip
    assert lynx_state(slow_pd.decode)["dropped_messages"] == dropped, "nothing of theirs reached Lynx"


def test_a_cached_prefix_streams_with_the_forward_and_a_prompt_sent_again_still_gets_its_kv(
    slow_pd, reference, bodies, int8
):
    """A prompt that extends the reference's, whose tokens the prefill server holds cached, sends
    every segment (the cached tokens' KV included) while its forward computes the few new tokens;
    sent again, its last token is recomputed into slots the radix cache swaps for its own, so its
    KV is sent after the forward. Both answers are equal and the decode server leaks nothing."""
    answers = []
    for _ in range(2):
        before = lynx_state(slow_pd.prefill)["segments_sent"]
        _, decode = slow_pd.generate_direct(bodies[LONGER])
        assert isinstance(decode, dict), decode
        after = lynx_state(slow_pd.prefill)["segments_sent"]
        answers.append((decode, {kind: after[kind] - before[kind] for kind in after}))
    (first_answer, first), (again_answer, again) = answers
    assert first["while_computed"] >= 1 and first["after_forward"] == 0, first
    assert again["while_computed"] == 0 and again["after_forward"] >= 1, again
    tally = judge_answers([int8["faults"][LONGER]] * 2, [first_answer, again_answer], int8["url"])
    print(f"\ncached prefix: {tally.summary()}")
    assert tally.ok, tally.partings
    assert _wait_free(slow_pd.decode, slow_pd.free_slots) == slow_pd.free_slots


def test_two_live_requests_with_one_room_never_get_a_wrong_answer(slow_pd, reference, bodies, int8, record):
    room = new_room()
    other = bodies[OTHER]
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        first = pool.submit(slow_pd.generate_direct, reference["body"], room)
        state = _wait_state(slow_pd.decode, _receiving)  # the first request holds the room on decode
        assert _receiving(state), f"the first request's transfer never started: {state}"
        second = pool.submit(slow_pd.generate_direct, other, room)
        answers = [first.result()[1], second.result()[1]]
    _, clean = slow_pd.generate_direct(other)
    tally = _assert_exact_and_drafted(clean, int8, OTHER, "after a duplicate room")
    for answer, which in zip(answers, (LONG, OTHER)):
        if isinstance(answer, dict):
            tally.add(_assert_exact_and_drafted(answer, int8, which, "beside a duplicate room"))
        else:
            assert "bootstrap_room" in answer or "tokens announced" in answer or "reserved" in answer, answer
    free = _wait_free(slow_pd.decode, slow_pd.free_slots)
    _record(record, "two live requests with one `bootstrap_room`, then one with its own", [*answers, clean], tally,
            held=slow_pd.free_slots - free)  # fmt: skip
    assert any(isinstance(a, str) for a in answers), "one of two requests sharing a room must be refused"
    assert free == slow_pd.free_slots
    _serves_small_request(slow_pd)


def test_a_client_abort_mid_transfer_frees_the_slots_for_the_next_request_which_is_exact(
    slow_pd, reference, int8, record
):
    rid = f"abort-{secrets.token_hex(4)}"
    answers = {}

    def run():
        answers["first"] = slow_pd.generate_direct({**reference["body"], "rid": rid})

    request = threading.Thread(target=run)
    request.start()
    state = _wait_state(slow_pd.decode, _receiving)
    assert _receiving(state), f"the transfer was never seen receiving: {state}"
    _abort(slow_pd.decode, rid)
    request.join(timeout=300)
    _, aborted = answers["first"]
    assert isinstance(aborted, str) or aborted["meta_info"]["finish_reason"]["type"] == "abort", aborted
    _, decode = slow_pd.generate_direct(reference["body"])
    tally = _assert_exact_and_drafted(decode, int8, LONG, "after an abort")
    free = _wait_free(slow_pd.decode, slow_pd.free_slots)
    _record(record, "a client abort (`/abort_request`) while the KV is arriving, the slots reused at once by the "
            "next request", [decode], tally, aborted=1,
            held=slow_pd.free_slots - free)  # fmt: skip
    assert free == slow_pd.free_slots


def test_a_burst_larger_than_the_decode_pool_queues_and_every_answer_is_exact(slow_pd, reference, int8, record):
    count = 3  # 3 x ~2.1k tokens > the 4,096-slot pool
    with concurrent.futures.ThreadPoolExecutor(count) as pool:
        answers = list(pool.map(lambda _: slow_pd.generate_direct(reference["body"])[1], range(count)))
    tally = Tally()
    for i, answer in enumerate(answers):
        tally.add(_assert_exact_and_drafted(answer, int8, LONG, f"burst request {i}"))
    free = _wait_free(slow_pd.decode, slow_pd.free_slots)
    _record(record, f"a burst larger than the decode pool ({count} x 2.1k tokens > {POOL_TOKENS:,} slots)", answers,
            tally, held=slow_pd.free_slots - free)  # fmt: skip
    assert free == slow_pd.free_slots


def test_a_mixed_load_with_client_aborts_through_the_router_leaks_nothing_and_answers_exactly(
    slow_pd, tokenizer, int8, model_path, record
):
    """24 requests, 8 at a time, through the router; every 6th client hangs up after its first
    event. Every other request is answered, and every answer equals int8 mode's (greedy: near
    ties, then int8 continued; seeded samples: the seeded near-tie rule); afterwards no slot and
    no Lynx room is held."""
    from lynx_deploy.streaming import abandon

    bodies = mixed_load(tokenizer, len(int8["mixed"]))

    def one(item):
        index, body = item
        if index % 6 == 5:
            return ("abandoned", abandon(f"{slow_pd.url}/generate", body))
        try:
            return ("answered", post_json(f"{slow_pd.url}/generate", body))
        except urllib.error.HTTPError as exc:
            return ("error", f"request {index}: HTTP {exc.code}: {exc.read().decode(errors='replace')[:300]}")

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        results = list(pool.map(one, enumerate(bodies)))
    answered = [(i, answer) for i, (kind, answer) in enumerate(results) if kind == "answered"]
    errors = [answer for kind, answer in results if kind == "error"]
    vocab = json.loads((model_path / "config.json").read_text())["vocab_size"]
    tally = Tally()
    for i, answer in answered:
        assert answer["meta_info"]["completion_tokens"] >= 1, answer
        assert answer["meta_info"]["finish_reason"]["type"] in ("length", "stop"), answer
        seed = bodies[i]["sampling_params"].get("sampling_seed")
        if seed is None:
            tally.add(judge_answers([int8["mixed"][i]], [answer], int8["url"], first_index=i))
        else:
            tally.add(judge_seeded(int8["mixed"][i], answer, seed, vocab, i))
    drafted = sum(a["meta_info"]["lynx"]["speculative_tokens"] > 0 for _, a in answered)
    print(f"\nmixed load vs int8: {tally.summary()}; {drafted} of {len(answered)} drafted on their anchors; "
          f"{len(errors)} failed: {errors}")  # fmt: skip
    free = _wait_free(slow_pd.decode, slow_pd.free_slots)
    abandoned = sum(kind == "abandoned" for kind, _ in results)
    _record(record, f"mixed load through the router: {len(bodies)} requests of 64-768 tokens (greedy, seeded "
            "sampling, stop strings), 8 at a time, every 6th client hanging up after its first event",
            [a for kind, a in results if kind != "abandoned"], tally, aborted=abandoned,
            held=slow_pd.free_slots - free)  # fmt: skip
    assert tally.ok, f"wrong answers: {[p for p in tally.partings if p.kind == 'mismatch']}"
    assert free == slow_pd.free_slots
    assert _wait_state(slow_pd.decode, lambda s: s["transfer_rooms"] == 0)["transfer_rooms"] == 0
    assert _wait_state(slow_pd.prefill, lambda s: s["transfer_rooms"] == 0)["transfer_rooms"] == 0
    assert errors == [], "every request a client kept waiting for must be answered"
    assert len(answered) == 20


@pytest.fixture(scope="module")
def kill_pd(model_path, server_logs, secret_file):
    """A `lynx`-mode pair on a 0.01 Gbit/s link (a 1k-token anchor takes ~5 s, its residual
    ~5 s more) whose prefill server the kill tests kill and restart."""
    lynx_args = [
        "--lynx-mode", "lynx",
        "--lynx-link-gbps", "0.01",
        "--lynx-transfer-timeout", "120",
        "--lynx-secret-file", str(secret_file),
    ]  # fmt: skip
    with PDDeployment(model_path, lynx_args, extra_args=CPU_MODEL_ARGS, log_dir=server_logs / "pd-kill") as pd:
        pd.restarts = 0
        yield pd


def _serving_prefill(pd: PDDeployment, model_path, server_logs) -> PDDeployment:
    """`pd` with a running prefill server (a new one, on the same bootstrap port, if it was killed)."""
    if pd.prefill.process is None or pd.prefill.process.poll() is not None:
        pd.restarts += 1
        command = pd.prefill.command[pd.prefill.command.index("--lynx") :]
        log = server_logs / "pd-kill" / f"prefill-{pd.restarts + 1}.log"
        pd.prefill = SGLangServer(model_path, command, log_path=log)
        pd.prefill.start().wait_ready()
    return pd


def test_killing_prefill_while_it_computes_the_prompt_fails_the_request_and_decode_keeps_serving(
    kill_pd, model_path, server_logs, tokenizer, record
):
    """The decode server has reserved the slots and the prefill is computing (or encoding) the
    prompt when it dies. A 2k-token prompt's forward takes seconds here, and its first layers'
    KV leaves while it runs, so the room is caught reserved or already receiving."""
    pd = _serving_prefill(kill_pd, model_path, server_logs)
    free = lynx_state(pd.decode)["kv_free_slots"]
    answers = {}
    request = threading.Thread(target=lambda: answers.update(zip(("prefill", "decode"),
                                                                 pd.generate_direct(_body(tokenizer, 2048)))))
    request.start()
    state = _wait_state(pd.decode, _computing)
    assert _computing(state), f"the decode server never reserved the room: {state}"
    pd.prefill.stop(grace=0)
    request.join(timeout=300)
    assert not request.is_alive(), "the request hung after its prefill server died"
    decode = answers["decode"]
    left = _wait_free(pd.decode, free)
    _record(record, "the prefill killed while it computes a 2k-token prompt (slots reserved)", [decode],
            held=free - left)  # fmt: skip
    assert isinstance(decode, str) and "prefill" in decode.lower() and "Traceback" not in decode, decode
    assert left == free
    _serves_small_request(_serving_prefill(pd, model_path, server_logs))


def test_killing_prefill_while_the_anchor_is_on_the_wire_fails_the_request_and_decode_keeps_serving(
    kill_pd, model_path, server_logs, tokenizer, record
):
    pd = _serving_prefill(kill_pd, model_path, server_logs)
    free = lynx_state(pd.decode)["kv_free_slots"]
    seen = {}

    def kill_during_transfer():
        seen["before_kill"] = _wait_state(pd.decode, _receiving)
        pd.prefill.stop(grace=0)

    _, decode = pd.generate_direct(_body(tokenizer, 1024), after_prefill=kill_during_transfer)
    left = _wait_free(pd.decode, free)
    _record(record, "the prefill killed while a 1k-token prompt's anchor is on the wire (0.01 Gbit/s)", [decode],
            held=free - left)  # fmt: skip
    assert _receiving(seen["before_kill"]), f"prefill was killed before the transfer: {seen['before_kill']}"
    assert isinstance(decode, str), "the request must fail once its prefill server is gone"
    assert "prefill" in decode.lower() and "Traceback" not in decode, decode
    assert left == free
    _serves_small_request(_serving_prefill(pd, model_path, server_logs))


def test_lynx_request_whose_residual_never_arrives_fails_without_unverified_tokens(
    kill_pd, model_path, server_logs, tokenizer, record
):
    """The anchor lands and decoding starts on it; then the prefill dies with the residual
    still on the wire. The client must have received only the exact first token, then an
    error, and the decode server must free every slot and keep serving."""
    pd = _serving_prefill(kill_pd, model_path, server_logs)
    free = lynx_state(pd.decode)["kv_free_slots"]
    fields = pd.bootstrap_fields()
    body = {**_body(tokenizer, 1024, max_new_tokens=64), **fields}
    prefill = threading.Thread(target=_post_quietly, args=(f"{pd.prefill.url}/generate", body))
    prefill.start()
    tokens_streamed, error = 0, None
    try:
        for event in sse_events(f"{pd.decode.url}/generate", body):
            meta = event.get("meta_info", {})
            if "error" in event or (meta.get("finish_reason") or {}).get("type") == "abort":
                error = json.dumps(event)
                break
            tokens_streamed = meta.get("completion_tokens", tokens_streamed)
            if tokens_streamed >= 1 and pd.prefill.process is not None:
                pd.prefill.stop(grace=0)  # the anchor landed: kill the residual's sender
    except OSError as exc:
        error = str(exc)
    prefill.join(timeout=60)
    left = _wait_free(pd.decode, free)
    _record(record, f"the prefill killed after the anchor landed, the residual on the wire ({tokens_streamed} "
            "token streamed before the error)", [_event_error(error)], held=free - left)  # fmt: skip
    assert error is not None, "the request must fail once its residual can no longer arrive"
    assert "residual" in error, error
    assert tokens_streamed == 1, "only the prefill's exact first token may have been streamed"
    assert left == free
    assert "failed: residual KV failed" in pd.decode.log_path.read_text()
    _serves_small_request(_serving_prefill(pd, model_path, server_logs))


def _event_error(error: str | None) -> str:
    """The message of a streamed error event (or the text of a broken stream)."""
    try:
        event = json.loads(error)
    except (TypeError, ValueError):
        return str(error)
    error, finish = event.get("error"), event.get("meta_info", {}).get("finish_reason") or {}
    return str((error.get("message") if isinstance(error, dict) else error) or finish.get("message") or event)


def _abort(server: SGLangServer, rid: str) -> None:
    """SGLang's `/abort_request` (it answers 200 with an empty body)."""
    data = json.dumps({"rid": rid}).encode()
    req = urllib.request.Request(f"{server.url}/abort_request", data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        assert resp.status == 200


def _post_quietly(url: str, body: dict) -> None:
    try:
        post_json(url, body, timeout=120)
    except OSError:
        pass  # the server is killed or the request aborted while answering
