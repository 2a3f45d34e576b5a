"""Exact token comparison with the one allowed exception: a near-tie in the reference.

A batched pass and step-by-step decoding add the same numbers in a different
order, so two correct greedy decoders can part where the reference's top two
choices are (nearly) tied. `compare_greedy` accepts a parting only there, and
only when the candidate took the reference's second choice.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

# Largest log-probability gap between the reference's top two tokens that
# counts as a tie. Never widen it to make a comparison pass.
NEAR_TIE_GAP = 0.02

# Two bf16 decoders (SGLang's kernels and transformers') round logits to bf16
# on their own: one bf16 step for a logit of magnitude 16 to 32, where these
# models' top logits lie, is 2**-3 nats. Two top logits one step apart are
# tied at bf16's resolution; only bf16-against-bf16 comparisons use this.
BF16_NEAR_TIE_GAP = 2.0**-3

# Rounding inside the layers moves a bf16 decoder's top-2 gap further from
# the full-precision model's: transformers' bf16 gaps differ from its fp32
# gaps by up to 0.40 nats on the serving tests' prompts (median 0.05-0.11 per
# prompt), and differently on another CPU. Two top tokens the fp32 model
# holds within this gap may come out in either order from a correct bf16
# decoder (`settle_bf16_parting`).
BF16_ROUNDING_GAP = 0.5

TopTwo = tuple[tuple[int, float], tuple[int, float]]


@dataclass(frozen=True)
class Comparison:
    """Outcome of comparing a candidate's greedy tokens with the reference's.

    verdict: ``"equal"`` (every compared token matches), ``"near_tie"`` (the
    outputs part at ``position`` where the candidate took the reference's
    second choice, ``gap`` below the tie threshold) or ``"mismatch"``.
    """

    verdict: str
    position: int | None = None
    gap: float | None = None
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.verdict in ("equal", "near_tie")


def compare_greedy(
    reference: Sequence[int],
    candidate: Sequence[int],
    reference_top2: Sequence[TopTwo],
    max_gap: float = NEAR_TIE_GAP,
) -> Comparison:
    """Compare two greedy outputs token by token.

    Args:
        reference: the reference decoder's output tokens.
        candidate: the tokens under test.
        reference_top2: per reference position, its two most likely tokens as
            ``((token, logprob), (token, logprob))``, best first.
        max_gap: largest top-2 logprob gap accepted as a tie (inclusive).
    """
    if len(reference_top2) < len(reference):
        raise ValueError("reference_top2 must cover every reference position")
    for pos, (ref_tok, cand_tok) in enumerate(zip(reference, candidate)):
        if ref_tok == cand_tok:
            continue
        (first, first_lp), (second, second_lp) = reference_top2[pos]
        gap = first_lp - second_lp
        tied_pair = {first, second} == {ref_tok, cand_tok}
        if tied_pair and gap <= max_gap:
            return Comparison("near_tie", pos, gap)
        return Comparison(
            "mismatch",
            pos,
            gap,
            f"position {pos}: reference {ref_tok}, candidate {cand_tok}, "
            f"reference top-2 {reference_top2[pos]}",
        )
    if len(reference) != len(candidate):
        shorter = min(len(reference), len(candidate))
        return Comparison(
            "mismatch",
            shorter,
            None,
            f"equal for {shorter} tokens, then lengths differ: "
            f"reference {len(reference)}, candidate {len(candidate)}",
        )
    return Comparison("equal")



def settle_bf16_parting(
    result: Comparison,
    candidate: Sequence[int],
    exact_top2: Callable[[list[int]], TopTwo],
) -> Comparison:
    """Judge a bf16 decoder's parting from a bf16 reference with the fp32 model.

    Rounding inside the layers puts two bf16 decoders more than one bf16
    step apart, so a parting wider than `BF16_NEAR_TIE_GAP` is no proof of a
    bug. `exact_top2(prefix)` gives the full-precision model's top two after
    the candidate's tokens before the parting (``candidate[:position]``);
    the parting is a tie when the full-precision model picks the candidate's
    token, or holds it second within `BF16_ROUNDING_GAP`. Any other mismatch
    is returned unchanged.
    """
    if result.verdict != "mismatch" or result.gap is None:
        return result
    pos = result.position
    chosen = candidate[pos]
    (first, first_lp), (second, second_lp) = exact_top2(list(candidate[:pos]))
    if first == chosen or (second == chosen and first_lp - second_lp <= BF16_ROUNDING_GAP):
        return Comparison("near_tie", pos, result.gap, f"position {pos}: the fp32 model's top-2 {(first, second)}")
    return Comparison(
        result.verdict, pos, result.gap, f"{result.detail}; fp32 top-2 {((first, first_lp), (second, second_lp))}"
    )


@dataclass(frozen=True)
class ResyncedComparison:
    """Every candidate token checked: equal stretches joined by near-tie partings."""

    ties: tuple[Comparison, ...]
    problem: Comparison | None

    @property
    def ok(self) -> bool:
        return self.problem is None


def compare_greedy_resynced(
    candidate: Sequence[int],
    generate: Callable[[list[int], int], tuple[list[int], list[TopTwo]]],
    max_gap: float = NEAR_TIE_GAP,
) -> ResyncedComparison:
    """Compare all of `candidate`, restarting the reference after each near-tie.

    `generate(prefix, n)` runs the reference greedily for at most `n` tokens
    after the prompt plus `prefix` (candidate tokens already judged) and
    returns its tokens and per-step top-2. After a near-tie at position p the
    reference resumes from ``candidate[:p + 1]``, so a parting never hides
    the tokens after it.
    """
    ties: list[Comparison] = []
    start = 0
    while True:
        expected, top2 = generate(list(candidate[:start]), len(candidate) - start)
        result = compare_greedy(expected, candidate[start:], top2, max_gap)
        if result.verdict == "equal":
            return ResyncedComparison(tuple(ties), None)
        shifted = Comparison(result.verdict, start + result.position, result.gap, result.detail)
        if result.verdict != "near_tie":
            return ResyncedComparison(tuple(ties), shifted)
        ties.append(shifted)
        start = shifted.position + 1
        if start >= len(candidate):
            return ResyncedComparison(tuple(ties), None)


def compare_sampled(
    reference: Sequence[int],
    candidate: Sequence[int],
    reference_logprobs: Sequence[dict[int, float]],
    seed: int,
    vocab_size: int,
    max_gap: float = NEAR_TIE_GAP,
) -> Comparison:
    """Compare two seeded samples drawn with `lynx.sampling` (temperature only).

    Both draw ``argmax(log pi(x) + g(x))`` with the same Gumbel noise ``g``,
    so they agree unless the reference's winner and the candidate's token were
    (nearly) tied after the noise. At the first parting the perturbed scores
    of both tokens are rebuilt from the reference's log-probabilities
    (`reference_logprobs`, per position a dict token -> log pi, the sampling
    distribution with the temperature applied, as SGLang returns it) and must
    differ by less than `max_gap`.
    """
    from lynx.sampling import gumbel_noise

    for pos, (ref_tok, cand_tok) in enumerate(zip(reference, candidate)):
        if ref_tok == cand_tok:
            continue
        known = reference_logprobs[pos]
        if ref_tok not in known or cand_tok not in known:
            return Comparison("mismatch", pos, None, f"position {pos}: {cand_tok} not among the reference's top tokens")
        noise = gumbel_noise(seed, pos, vocab_size)
        score = {t: known[t] + float(noise[t]) for t in (ref_tok, cand_tok)}
        gap = abs(score[ref_tok] - score[cand_tok])
        if gap < max_gap:
            return Comparison("near_tie", pos, gap)
        return Comparison(
            "mismatch", pos, gap, f"position {pos}: reference {ref_tok}, candidate {cand_tok}, perturbed gap {gap:.4f}"
        )
    if len(reference) != len(candidate):
        shorter = min(len(reference), len(candidate))
        return Comparison("mismatch", shorter, None, f"equal for {shorter} tokens, then lengths differ")
    return Comparison("equal")


def sampling_pit(tokens: Sequence[int], logprobs: Sequence[dict[int, float]], uniform: Callable[[], float]) -> list[float]:
    """Randomized probability integral transform of sampled tokens (one value per position).

    `logprobs[i]` holds the log-probabilities of the reference's top tokens
    under the full-precision sampling distribution at position i (temperature
    applied, as SGLang returns them), given the same prefix; the tokens
    outside it form one "rest" category with the leftover mass. Ordering the
    categories by probability, a token drawn from that distribution maps to
    ``F(before) + U * p(token)``, uniform on [0, 1) when the sampler is right
    (positions of one sequence too: each is uniform given the ones before).
    `uniform()` supplies U.
    """
    values = []
    for token, known in zip(tokens, logprobs, strict=True):
        order = sorted(known, key=known.get, reverse=True)
        probs = [math.exp(known[t]) for t in order]
        if token in known:
            index = order.index(token)
            before, mass = sum(probs[:index]), probs[index]
        else:
            before = sum(probs)
            mass = max(0.0, 1.0 - before)
        values.append(before + uniform() * mass)
    return values
