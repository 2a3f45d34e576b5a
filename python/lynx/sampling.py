"""Seeded Gumbel-max sampling: the same draw for the anchor phase and the verify pass.

A Lynx decode server samples every token of a ``temperature > 0`` request as

    token = argmax_x( log pi(x) + g(x) ),   g = Gumbel noise seeded by (seed, position)

where ``pi`` is the request's sampling distribution (temperature, top-k,
top-p, min-p applied to the logits). By the Gumbel-max trick the token is
distributed exactly as ``pi``. The anchor phase draws its speculative token
at a position with the same noise as the verify pass will, so verification
is an equality test: a speculative token survives exactly when full-precision
decoding would have drawn the same token. The emitted sequence is therefore
what full-precision decoding with that seed emits, hence the same
distribution; a seeded request repeats itself except where two tokens tie
after the noise and the verify pass rounds differently from step-by-step
decoding (the tests judge such partings with the near-tie rule).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SamplingRule:
    """How one request turns logits into a distribution (SGLang's sampling parameters)."""

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0

    @property
    def greedy(self) -> bool:
        return self.top_k == 1 or self.temperature == 0.0


def sampling_logprobs(logits: torch.Tensor, rule: SamplingRule) -> torch.Tensor:
    """Log-probabilities of the sampling distribution; excluded tokens get -inf.

    Args:
        logits: ``[vocab]`` or ``[rows, vocab]`` raw logits.
    """
    scores = logits.float() / max(rule.temperature, 1e-6)
    vocab = scores.shape[-1]
    if 0 < rule.top_k < vocab:
        kth = torch.topk(scores, rule.top_k, dim=-1).values[..., -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    logprobs = torch.log_softmax(scores, dim=-1)
    if rule.top_p < 1.0:
        sorted_lp, order = torch.sort(logprobs, dim=-1, descending=True)
        mass_before = torch.cumsum(sorted_lp.exp(), dim=-1) - sorted_lp.exp()
        drop_sorted = mass_before > rule.top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logprobs = torch.log_softmax(logprobs.masked_fill(drop, float("-inf")), dim=-1)
    if rule.min_p > 0.0:
        floor = logprobs.max(dim=-1, keepdim=True).values + torch.log(torch.tensor(rule.min_p))
        logprobs = torch.log_softmax(logprobs.masked_fill(logprobs < floor, float("-inf")), dim=-1)
    return logprobs


def gumbel_noise(seed: int, position: int, vocab: int) -> torch.Tensor:
    """Standard Gumbel noise ``[vocab]`` determined by (seed, position) alone (CPU, float64)."""
    digest = hashlib.blake2b(f"{seed}:{position}".encode(), digest_size=8).digest()
    generator = torch.Generator().manual_seed(int.from_bytes(digest, "little") & ((1 << 63) - 1))
    uniform = torch.rand(vocab, generator=generator, dtype=torch.float64)
    tiny = torch.finfo(torch.float64).tiny
    return -torch.log(-torch.log(uniform.clamp(min=tiny)))


def draw(logits: torch.Tensor, rule: SamplingRule, seed: int, position: int) -> int:
    """The token at output `position`: argmax(log pi + g(seed, position)), or argmax(logits) if greedy."""
    if rule.greedy:
        return int(torch.argmax(logits))
    logprobs = sampling_logprobs(logits, rule).double().cpu()
    return int(torch.argmax(logprobs + gumbel_noise(seed, position, logprobs.shape[-1])))
