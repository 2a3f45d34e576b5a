"""The TTFT sweep's outputs: each measured request's tokens and top logprobs, and lynx judged against int8.

Every measured request asks for the top logprobs of each output position (the
same request in every mode: `LOGPROBS`), and its run keeps the output tokens
(``output_ids``) and, until judged, the top logprobs (``tops``). `judge_rows`
judges each ``lynx`` run against the ``int8`` run of the same request (same
point, same repeat; `ttft_verdicts.judged_pairs`): greedy types by the near-tie
rule, after a tie against a reference continued from lynx's prefix on a single
server that decodes as int8 mode (``--lynx-loopback --lynx-mode int8``,
started the first time a tie needs it); seeded samples by the seeded near-tie
rule. Where no continuation can rebuild a request's state (a grammar, a
repetition penalty, a sample's position-seeded noise), the tokens after a tie
are counted as unchecked. Each judged lynx row keeps the counts and every
parting with its gap, and how far its returned logprobs of greedy outputs are
from int8's before any parting: of each output token (``judged["logprob_drift"]``:
positions, max, mean) and of every other logprob both returned
(``judged["logprob_drift_more"]``: per kind, ``top`` for the top-logprob
lists and ``token_ids`` for the asked token ids, values, max, mean).
"""

from __future__ import annotations

import contextlib
import json
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

from lynx_testing.judge import Answer, Tally, judge_pair, judge_sampled, request_continuation, top_two
from lynx_deploy.processes import post_json
from lynx_deploy.server import SGLangServer
from lynx_deploy.streaming import stream_generate
from ttft_verdicts import judged_pairs

# Top logprobs per output position in every mode's requests: two judge a greedy parting; a
# seeded sample's parting token may rank lower in the reference (`exactness.compare_sampled`).
LOGPROBS = {"greedy": 2, "sampled": 20}
# A run's per-position logprob lists, which the judging reads and the JSON does not keep.
JUDGED_ONLY = ("tops", "ids_tops")


def kept(run: dict) -> dict:
    """`run` as a JSON keeps it: without `JUDGED_ONLY`."""
    return {k: v for k, v in run.items() if k not in JUDGED_ONLY}


def stream_recorded(url: str, body: dict, nth: Sequence[int] = (1,), timeout: float = 600.0) -> dict:
    """`lynx_deploy.streaming.stream_generate`'s timings of a streaming `/generate`, with its outputs."""
    return stream_generate(url, body, nth, timeout, outputs=True)


def stream_direct_recorded(pd, body: dict, room: int, nth: Sequence[int] = (1,), timeout: float = 600.0) -> dict:
    """`stream_recorded` of the decode server's stream, the request sent to both servers with
    bootstrap room `room` (bypassing the router), plus ``prefill_s``: the prefill server's own time
    for the request (bootstrap, prefill, KV snapshot), as `PDDeployment.stream_direct` reports it,
    and ``prefill_cached_tokens``: how many prompt tokens its radix cache held."""
    fields = pd.bootstrap_fields(room)
    prefill: dict = {}

    def call() -> None:
        try:
            prefill["answer"] = post_json(f"{pd.prefill.url}/generate", {**body, **fields}, timeout)
        except OSError as exc:
            prefill["error"] = f"{type(exc).__name__}: {exc}"

    thread = threading.Thread(target=call)
    thread.start()
    try:
        result = stream_recorded(f"{pd.decode.url}/generate", {**body, **fields}, nth, timeout)
    finally:
        thread.join(timeout)
    if "answer" not in prefill:
        raise RuntimeError(f"the prefill server did not answer: {prefill.get('error', 'timed out')}")
    meta = prefill["answer"]["meta_info"]
    return {**result, "prefill_s": meta["e2e_latency"], "prefill_cached_tokens": meta.get("cached_tokens")}


def judge_rows(
    rows: list[dict],
    request_of: Callable[[dict, dict], dict],
    encode: Callable[[str], list[int]],
    reference_url: Callable[[], str],
    vocab: int,
) -> list[dict]:
    """Judge every ``lynx`` row's runs against its ``int8`` row's; sets ``row["judged"]``.

    `request_of(row, run)` gives the body a run sent; `reference_url()` the URL of the int8
    continuation server (asked only after a near tie). Returns one summary per judged row.
    """
    out = []
    for lynx, int8 in judged_pairs(rows):
        tally, drifts = Tally(), {}
        for index, (mine, ref) in enumerate(zip(lynx["runs"], int8["runs"])):
            if mine.get("output_ids") is None or ref.get("output_ids") is None:
                continue  # a run recorded without its tokens
            body = request_of(lynx, mine)
            tally.add(_judge_run(mine, ref, body, encode, reference_url, vocab, index))
            if body["sampling_params"].get("temperature", 0) == 0:
                for kind, values in logprob_drift(mine, ref).items():
                    drifts.setdefault(kind, []).extend(values)
        lynx["judged"] = tally.as_dict()
        if drifts.get("output"):
            lynx["judged"]["logprob_drift"] = _stats(drifts.pop("output"), "positions")
        more = {kind: _stats(values, "values") for kind, values in drifts.items() if values}
        if more:
            lynx["judged"]["logprob_drift_more"] = more
        out.append({k: lynx.get(k) for k in ("link_gbps", "prompt_tokens", "request_type", "segment_tokens", "transport")}
                   | {"summary": tally.summary(), "ok": tally.ok})  # fmt: skip
    return out


def _stats(values: list[float], counted: str) -> dict:
    return {counted: len(values), "max": max(values), "mean": sum(values) / len(values)}


def logprob_drift(mine: dict, ref: dict) -> dict[str, list[float]]:
    """How far lynx's returned logprobs are from int8's, position by position up to where the two
    outputs part: ``output``, the logprob of the output token (the same token after the same prefix;
    both top lists hold it); ``top``, every other token both top lists hold; ``token_ids``, every
    asked token id both returned."""
    drifts: dict[str, list[float]] = {"output": [], "top": [], "token_ids": []}
    positions = zip(mine["output_ids"], ref["output_ids"], mine.get("tops") or (), ref.get("tops") or ())
    for pos, (token, other, tops, ref_tops) in enumerate(positions):
        if token != other:
            break
        theirs = {int(t): lp for lp, t, *_ in ref_tops}
        for lp, t, *_ in tops:
            if int(t) in theirs and lp is not None and theirs[int(t)] is not None:
                drifts["output" if int(t) == token else "top"].append(abs(lp - theirs[int(t)]))
        mine_ids, ref_ids = _at(mine.get("ids_tops"), pos), _at(ref.get("ids_tops"), pos)
        if mine_ids and ref_ids:  # none for the first token: the prefill does not compute them
            asked = {int(t): lp for lp, t, *_ in ref_ids}
            drifts["token_ids"] += [abs(lp - asked[int(t)]) for lp, t, *_ in mine_ids if int(t) in asked]
    return drifts


def _at(entries, pos: int):
    return entries[pos] if entries and pos < len(entries) else None


def _judge_run(mine: dict, ref: dict, body: dict, encode, reference_url, vocab: int, index: int) -> Tally:
    params = body["sampling_params"]
    if params.get("temperature", 0) > 0:
        known = [{int(t): lp for lp, t, *_ in p} for p in ref["tops"]]
        return judge_sampled(mine["output_ids"], ref["output_ids"], known, params["sampling_seed"], vocab, index)
    prompt = encode(body["text"])
    if ref.get("prompt_tokens") not in (None, len(prompt)):
        raise RuntimeError(f"the prompt tokenized to {len(prompt)} tokens here, {ref['prompt_tokens']} on the server")
    reference = Answer(tuple(prompt), tuple(ref["output_ids"]), tuple(top_two(ref["tops"])))
    continues = request_continuation(post_json, "", params, len(prompt)) is not None

    def continuation(ids, n):
        return request_continuation(post_json, reference_url(), params, len(prompt))(ids, n)

    candidate = Answer(tuple(prompt), tuple(mine["output_ids"]))
    return judge_pair(candidate, reference, continuation if continues else None, index)


def judge_with_loopback(rows: list[dict], request_of, encode, model, server_args: Sequence[str], log_dir: Path) -> list[dict]:
    """`judge_rows` with an int8 loopback server of `model` (``--lynx --lynx-mode int8 --lynx-loopback
    *server_args``) as the continuation server, started the first time a near tie needs it."""
    vocab = json.loads((Path(model) / "config.json").read_text())["vocab_size"]
    with contextlib.ExitStack() as stack:
        started: list[SGLangServer] = []

        def reference_url() -> str:
            if not started:
                print("judging: starting the int8 continuation server", file=sys.stderr, flush=True)
                args = ["--lynx", "--lynx-mode", "int8", "--lynx-loopback", *server_args]
                started.append(stack.enter_context(SGLangServer(model, args, log_path=log_dir / "continuation.log")))
            return started[0].url

        return judge_rows(rows, request_of, encode, reference_url, vocab)
