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

from lynx_testing.exactness import NEAR_TIE_GAP, TopTwo, compare_greedy_resynced

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
    partings: list[Parting] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.wrong == 0 and self.unmatched == 0

    def add(self, other: Tally) -> None:
        """Add `other`'s counts and partings to these."""
        for name in ("answers", "tokens", "equal", "equal_after_ties", "wrong", "unmatched", "continuations", "failed"):
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
            "near_ties": sum(p.kind == "near_tie" for p in self.partings),
            "partings": [p.__dict__ for p in self.partings],
        }


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
        tally.answers += 1
        ref = by_prompt.get(cand.prompt_ids)
        if ref is None:
            tally.unmatched += 1
            continue
        tally.tokens += len(cand.output_ids)

        def generate(prefix: list[int], n: int, ref=ref) -> tuple[list[int], list[TopTwo]]:
            if not prefix:
                return list(ref.output_ids), list(ref.top2)
            tally.continuations += 1
            return continue_reference([*ref.prompt_ids, *prefix], n)

        result = compare_greedy_resynced(list(cand.output_ids), generate, max_gap)
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
