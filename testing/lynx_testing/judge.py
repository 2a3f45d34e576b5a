"""Judge every token of a candidate's greedy outputs against a reference deployment.

The reference's own recorded answer (tokens and top-2 log-probabilities per
position) judges the candidate first (`exactness.compare_greedy`). Where the
two part at a near tie, the tokens after it are not skipped: the reference is
asked again, continued from the candidate's own prefix up to and including
the tie, and the rest is compared with that (`compare_greedy_resynced`), as
often as the outputs part. Anything but equal stretches joined by near ties is
a mismatch, reported with its position and gap.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from lynx_testing.exactness import NEAR_TIE_GAP, TopTwo, compare_greedy, compare_greedy_resynced, compare_sampled

# `generate(prompt_ids, n)`: the reference's greedy tokens after `prompt_ids`, at most `n`,
# with their per-position top-2 ``((token, logprob), (token, logprob))``.
Generate = Callable[[list[int], int], tuple[list[int], list[TopTwo]]]


def top_two(positions: Iterable[Sequence[Sequence[float]]]) -> list[TopTwo]:
    """SGLang's ``output_top_logprobs`` (per position ``[[logprob, token, ...], ...]``, best first)
    as ``((token, logprob), (token, logprob))`` per position."""
    return [((int(p[0][1]), float(p[0][0])), (int(p[1][1]), float(p[1][0]))) for p in positions]


@dataclass(frozen=True)
class Answer:
    """One greedy answer: the prompt's token ids, the output's, and its top-2 per position."""

    prompt_ids: tuple[int, ...]
    output_ids: tuple[int, ...]
    top2: tuple[TopTwo, ...] = ()


@dataclass(frozen=True)
class Parting:
    """Where a candidate left the reference: ``kind`` is ``near_tie`` or ``mismatch``."""

    request: int
    position: int
    kind: str
    gap: float | None
    detail: str = ""


@dataclass
class Tally:
    """Counts over every judged answer; `partings` lists each one with its gap."""

    answers: int = 0
    tokens: int = 0
    equal: int = 0
    equal_after_ties: int = 0
    wrong: int = 0
    unmatched: int = 0
    continuations: int = 0
    failed: int = 0
    unchecked: int = 0  # tokens after a near tie that no continuation could judge (`judge_pair`)
    partings: list[Parting] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.wrong == 0 and self.unmatched == 0

    def add(self, other: Tally) -> None:
        """Add `other`'s counts and partings to these."""
        for name in ("answers", "tokens", "equal", "equal_after_ties", "wrong", "unmatched", "continuations", "failed",
                     "unchecked"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.partings += other.partings

    def as_dict(self) -> dict:
        return {
            "answers": self.answers,
            "tokens_judged": self.tokens,
            "equal": self.equal,
            "equal_after_near_ties": self.equal_after_ties,
            "wrong": self.wrong,
            "without_reference": self.unmatched,
            "reference_continuations": self.continuations,
            "failed_requests": self.failed,
            "tokens_unchecked": self.unchecked,
            "near_ties": sum(p.kind == "near_tie" for p in self.partings),
            "partings": [p.__dict__ for p in self.partings],
        }

    def summary(self) -> str:
        """One line: the counts a test or a benchmark prints."""
        ties = sum(p.kind == "near_tie" for p in self.partings)
        gaps = ", ".join(f"{p.gap:.4f}" for p in self.partings if p.kind == "near_tie" and p.gap is not None)
        text = (f"{self.answers} answers, {self.tokens} tokens: {self.equal} equal, {self.equal_after_ties} equal "
                f"after {ties} near ties{f' (gaps {gaps})' if gaps else ''}, {self.wrong} wrong")
        if self.unchecked:
            text += f", {self.unchecked} tokens after a tie unchecked"
        if self.unmatched:
            text += f", {self.unmatched} without a reference"
        return text


def judge(
    candidates: Sequence[Answer],
    references: Sequence[Answer],
    continue_reference: Generate,
    max_gap: float = NEAR_TIE_GAP,
) -> Tally:
    """Judge each candidate against the reference answer with the same prompt.

    `continue_reference` is only called after a near tie, with the prompt plus
    the candidate's tokens through the tie. A candidate whose prompt the
    references lack counts as ``without_reference`` (never as equal).
    """
    by_prompt = {r.prompt_ids: r for r in references}
    tally = Tally()
    for index, cand in enumerate(candidates):
        ref = by_prompt.get(cand.prompt_ids)
        if ref is None:
            tally.answers += 1
            tally.unmatched += 1
            continue
        tally.add(judge_pair(cand, ref, continue_reference, index, max_gap))
    return tally


def judge_pair(
    candidate: Answer,
    reference: Answer,
    continue_reference: Generate | None,
    index: int = 0,
    max_gap: float = NEAR_TIE_GAP,
) -> Tally:
    """Judge one candidate against the reference's answer to the same request.

    `continue_reference(prompt_ids, n)` continues the reference after the
    prompt plus the candidate's tokens through a near tie. Where no
    continuation can rebuild the request's state (`continuation_params` gives
    None: penalties over the output, a grammar), pass None: the judging ends
    at the first near tie and the tokens after it are counted as
    ``unchecked``, never as equal. `index` names the request in partings.
    """
    if continue_reference is None:
        first = compare_greedy(reference.output_ids, candidate.output_ids, reference.top2, max_gap)
        return _first_parting(first, len(candidate.output_ids), index)
    tally = Tally(answers=1, tokens=len(candidate.output_ids))

    def generate(prefix: list[int], n: int) -> tuple[list[int], list[TopTwo]]:
        if not prefix:
            return list(reference.output_ids), list(reference.top2)
        tally.continuations += 1
        return continue_reference([*reference.prompt_ids, *prefix], n)

    result = compare_greedy_resynced(list(candidate.output_ids), generate, max_gap)
    tally.partings += [Parting(index, t.position, "near_tie", t.gap) for t in result.ties]
    if result.problem is not None:
        p = result.problem
        tally.wrong += 1
        tally.partings.append(Parting(index, p.position, "mismatch", p.gap, p.detail))
    elif result.ties:
        tally.equal_after_ties += 1
    else:
        tally.equal += 1
    return tally


def judge_sampled(
    candidate: Sequence[int],
    reference: Sequence[int],
    reference_logprobs: Sequence[dict[int, float]],
    seed: int,
    vocab_size: int,
    index: int = 0,
    max_gap: float = NEAR_TIE_GAP,
) -> Tally:
    """Judge one seeded sample (`lynx.sampling`) against the reference's sample with the same seed.

    `exactness.compare_sampled` judges the first parting. The noise is seeded
    by the output position, which a continuation from a prompt would restart,
    so the tokens after a near tie are counted as ``unchecked``.
    """
    result = compare_sampled(reference, candidate, reference_logprobs, seed, vocab_size, max_gap)
    return _first_parting(result, len(candidate), index)


def _first_parting(result, tokens: int, index: int) -> Tally:
    """The tally of one answer judged up to its first parting (`exactness`' verdict): the tokens
    after a near tie are ``unchecked``."""
    tally = Tally(answers=1, tokens=tokens)
    if result.verdict == "near_tie":
        tally.partings.append(Parting(index, result.position, "near_tie", result.gap))
        tally.unchecked += tokens - result.position - 1
        tally.equal_after_ties += 1
    elif result.verdict == "mismatch":
        tally.wrong += 1
        tally.partings.append(Parting(index, result.position, "mismatch", result.gap, result.detail))
    else:
        tally.equal += 1
    return tally


def server_continuation(post_json: Callable[[str, dict], dict], url: str, extra: dict | None = None) -> Generate:
    """A `Generate` that asks an SGLang server's ``/generate`` (greedy, EOS ignored, top-2 logprobs)."""

    def generate(prompt_ids: list[int], n: int) -> tuple[list[int], list[TopTwo]]:
        body = {
            "input_ids": prompt_ids,
            "sampling_params": {"max_new_tokens": n, "temperature": 0, "ignore_eos": True},
            "return_logprob": True,
            "top_logprobs_num": 2,
            **(extra or {}),
        }
        answer = post_json(f"{url}/generate", body)
        return list(answer["output_ids"]), top_two(answer["meta_info"]["output_top_logprobs"])

    return generate


# Sampling parameters (with their neutral values) whose effect depends on the output so far:
# SGLang's frequency, presence and repetition penalties count output tokens only, and a grammar
# follows the output from its start. A prompt that ends with the candidate's prefix starts them afresh.
HISTORY_PARAMS = {
    "frequency_penalty": 0.0, "presence_penalty": 0.0, "repetition_penalty": 1.0,
    "json_schema": None, "regex": None, "ebnf": None, "structural_tag": None,
}  # fmt: skip
# Parameters that act on each position alone, so a continuation keeps them.
STATELESS_PARAMS = ("logit_bias",)


def continuation_params(sampling_params: dict, prefix_tokens: int) -> dict | None:
    """The sampling parameters that continue a greedy request `prefix_tokens` into its output.

    Greedy, EOS ignored (the caller asks for exactly the tokens left to judge;
    stop conditions only end an output, so they are dropped), `logit_bias`
    kept, `min_new_tokens` less the prefix. None when the request's state
    cannot be rebuilt from a prompt (`HISTORY_PARAMS` with a non-neutral value).
    """
    if any(sampling_params.get(name, neutral) not in (neutral, None) for name, neutral in HISTORY_PARAMS.items()):
        return None
    params = {"temperature": 0, "ignore_eos": True}
    params.update({k: sampling_params[k] for k in STATELESS_PARAMS if sampling_params.get(k) is not None})
    if sampling_params.get("min_new_tokens"):
        params["min_new_tokens"] = max(0, int(sampling_params["min_new_tokens"]) - prefix_tokens)
    return params


def request_continuation(
    post_json: Callable[[str, dict], dict], url: str, sampling_params: dict, prompt_tokens: int
) -> Generate | None:
    """A `Generate` that continues one request (its `prompt_tokens`-token prompt and its sampling
    parameters) on an SGLang server; None where `continuation_params` says it cannot."""
    if continuation_params(sampling_params, 0) is None:
        return None

    def generate(prompt_ids: list[int], n: int) -> tuple[list[int], list[TopTwo]]:
        params = continuation_params(sampling_params, len(prompt_ids) - prompt_tokens)
        body = {"input_ids": prompt_ids, "sampling_params": {**params, "max_new_tokens": n},
                "return_logprob": True, "top_logprobs_num": 2}  # fmt: skip
        answer = post_json(f"{url}/generate", body)
        return list(answer["output_ids"]), top_two(answer["meta_info"]["output_top_logprobs"])

    return generate


def answer_of(prompt_ids: Sequence[int], reply: dict) -> Answer:
    """An SGLang ``/generate`` reply as an `Answer` (its top-2 where it asked for top logprobs)."""
    tops = (reply.get("meta_info") or {}).get("output_top_logprobs") or []
    return Answer(tuple(prompt_ids), tuple(int(t) for t in reply["output_ids"]), tuple(top_two(tops)))
