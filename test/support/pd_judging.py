"""Judging the PD tests' answers: every token of a candidate against its reference's answer.

A reference answer carries its request (`annotate`: the prompt's token ids and
sampling parameters) and the top logprobs of each output position. Where a
candidate parts from it at a near tie, the tokens after the tie are judged
against a reference continued from the candidate's own prefix
(`lynx_testing.judge`), on a single server that decodes exactly as the
reference deployment (`ContinuationServers`), started the first time a tie
needs it. Partings are printed with their gaps.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from types import SimpleNamespace

from lynx_testing.judge import Generate, Tally, answer_of, judge_pair, judge_sampled, request_continuation
from lynx_deploy.processes import post_json
from lynx_deploy.server import CPU_MODEL_ARGS, SGLangServer, ServerSlot

REQUEST = "request"  # the key `annotate` adds to an answer: {"prompt_ids", "sampling_params"}


def annotate(answer, body: dict, encode: Callable[[str], list[int]]) -> None:
    """Give `answer` (a `/generate` reply, or a list of them for a list `text`) its request."""
    if not isinstance(answer, (dict, list)) or "text" not in body:
        return
    texts = body["text"] if isinstance(body["text"], list) else [body["text"]]
    replies = answer if isinstance(answer, list) else [answer]
    params = body.get("sampling_params", {})
    if len(replies) != len(texts):  # n > 1: each sample of one prompt
        texts = texts * (len(replies) // len(texts))
    for reply, text in zip(replies, texts, strict=True):
        ids = encode(text)
        if reply.get("meta_info", {}).get("prompt_tokens") not in (None, len(ids)):
            raise AssertionError(f"prompt tokenized to {len(ids)} tokens here, {reply['meta_info']['prompt_tokens']} there")
        reply[REQUEST] = {"prompt_ids": ids, "sampling_params": params}


class ContinuationServers(ServerSlot):
    """Single servers that continue a reference deployment's answers, one running at a time.

    `url(args)` starts ``--lynx *args`` (stopping any other) the first time it is asked for.
    """

    def __init__(self, model_path, log_dir, server_args: Sequence[str] = CPU_MODEL_ARGS) -> None:
        super().__init__()
        self._model_path, self._log_dir, self._server_args = model_path, log_dir, tuple(server_args)

    def url(self, args: Sequence[str]) -> str:
        args = tuple(args)

        def make() -> SGLangServer:
            name = "-".join(args).replace("--", "").replace("+", "") or "plain"
            return SGLangServer(self._model_path, ["--lynx", *args, *self._server_args],
                                log_path=self._log_dir / f"continuation-{name}.log")  # fmt: skip

        return self.serve(args, make)


def continuation_of(reference: dict, url: Callable[[], str]) -> Generate | None:
    """A `Generate` continuing `reference`'s request on the server `url()` gives (asked only after a
    tie); None where the request's state cannot be rebuilt from a prompt."""
    request = reference[REQUEST]
    params, prompt_tokens = request["sampling_params"], len(request["prompt_ids"])
    if request_continuation(post_json, "", params, prompt_tokens) is None:
        return None
    return lambda ids, n: request_continuation(post_json, url(), params, prompt_tokens)(ids, n)


def judge_answers(references: Sequence[dict], candidates: Sequence[dict], url: Callable[[], str],
                  first_index: int = 0) -> Tally:  # fmt: skip
    """Each candidate against the reference answer at its index (`url`: the continuation server;
    partings name requests from `first_index` on)."""
    tally = Tally()
    for index, (ref, cand) in enumerate(zip(references, candidates, strict=True), start=first_index):
        prompt = ref[REQUEST]["prompt_ids"]
        tally.add(judge_pair(answer_of(prompt, cand), answer_of(prompt, ref), continuation_of(ref, url), index))
    return tally


def assert_greedy_answers_equal(references: Sequence[dict], candidates: Sequence[dict], label: str,
                                url: Callable[[], str]) -> Tally:  # fmt: skip
    """Every candidate token equals its reference's, or parts only at a near tie after which the rest
    equals the reference continued from the candidate's prefix; prints and returns the counts."""
    tally = judge_answers(references, candidates, url)
    print(f"\n{label}: {tally.summary()}")
    assert tally.ok, f"{label}: {[p for p in tally.partings if p.kind == 'mismatch']}"
    return tally


def top_logprobs(answer: dict) -> list[dict[int, float]]:
    """Per output position, token -> logprob of the reference's top tokens."""
    return [{int(t): lp for lp, t, *_ in p} for p in answer["meta_info"]["output_top_logprobs"]]


def judge_seeded(reference: dict, candidate: dict, seed: int, vocab: int, index: int = 0) -> Tally:
    """A seeded sample against the reference's sample with the same seed (`judge_sampled`)."""
    return judge_sampled(candidate["output_ids"], reference["output_ids"], top_logprobs(reference), seed, vocab, index)


def sample_seed(sampling_seed: int, room: int, sample: int, n: int) -> int:
    """The Gumbel seed of sample `sample` (0-based) of an ``n``-sample request sent with bootstrap room `room`."""
    from lynx_patches.speculate.parallel import sample_room
    from lynx_patches.speculate.state import request_seed

    params = SimpleNamespace(sampling_seed=sampling_seed, n=n)
    return request_seed(SimpleNamespace(sampling_params=params, bootstrap_room=sample_room(room, sample + 1)))
