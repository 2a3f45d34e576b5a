"""Per-request Lynx state on a decode server (lives on the SGLang `Req` as `req.lynx`)."""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field

from lynx.sampling import SamplingRule

ATTR = "lynx"


@dataclass
class SpecState:
    """Where a ``lynx``-mode request stands.

    Attributes:
        room: the request's bootstrap room (its transfer on this decode rank).
        verified: leading output tokens that are exact (streamable); the rest
            were generated on the anchor and are held back.
        cap: speculative tokens allowed before the request waits (0 = none).
        anchor: True until the residual has been applied and checked.
        parked: waiting for its residual outside SGLang's queues.
        rule: the sampling distribution; None for greedy decoding.
        seed: seeds the Gumbel noise of every sampled token (`lynx.sampling`).
        barred_from_tree: the request's own `skip_radix_cache_insert`, which
            the anchor phase overrides (anchor KV must never enter the tree).
        timings: the transfer's milestones (seconds from the request's arrival).
    """

    room: int
    verified: int
    cap: int
    rule: SamplingRule | None = None
    seed: int = 0
    barred_from_tree: bool = False
    anchor: bool = True
    parked: bool = False
    speculative_tokens: int = 0
    accepted_tokens: int = 0
    rollbacks: int = 0
    verify_s: float = 0.0
    timings: dict = field(default_factory=dict)

    def speculated(self, output_len: int) -> int:
        """Held-back tokens of an output of `output_len` tokens."""
        return output_len - self.verified

    def metrics(self) -> dict:
        return {
            "speculative_tokens": self.speculative_tokens,
            "accepted_tokens": self.accepted_tokens,
            "rollbacks": self.rollbacks,
            "verify_s": round(self.verify_s, 6),
        }


def state_of(req) -> SpecState | None:
    return getattr(req, ATTR, None)


def in_anchor_phase(req) -> bool:
    state = state_of(req)
    return state is not None and state.anchor


def sampling_rule(sampling_params) -> SamplingRule | None:
    """The request's distribution for Lynx's seeded sampler; None when greedy."""
    rule = SamplingRule(
        temperature=sampling_params.temperature,
        top_k=sampling_params.top_k,
        top_p=sampling_params.top_p,
        min_p=sampling_params.min_p,
    )
    return None if rule.greedy else rule


def coupled_rows(reqs, choose) -> list[tuple]:
    """``(row, rule, seed, position)`` of each request for which `choose(req)` gives ``(rule, seed)``.

    These are the rows Lynx's seeded sampler draws (`lynx.sampling.draw`); the
    position is the index of the token being drawn in the request's output.
    """
    rows = []
    for row, req in enumerate(reqs):
        chosen = choose(req)
        if chosen is not None:
            rows.append((row, *chosen, len(req.output_ids)))
    return rows


def request_seed(sampling_params) -> int:
    seed = sampling_params.sampling_seed
    return secrets.randbits(63) if seed is None else int(seed)


def can_speculate(sampling_params, req) -> bool:
    """Whether the verify pass reproduces this request's token choice exactly.

    Greedy and plainly sampled requests (temperature, top-k, top-p, min-p)
    qualify. Requests that shape logits otherwise (penalties, bias, grammars)
    or return logprobs still run in ``lynx`` mode, but wait for their
    residual before decoding.
    """
    plain = (
        not sampling_params.logit_bias
        and sampling_params.frequency_penalty == 0.0
        and sampling_params.presence_penalty == 0.0
        and sampling_params.repetition_penalty == 1.0
        and sampling_params.min_new_tokens == 0
        and not (sampling_params.json_schema or sampling_params.regex or sampling_params.ebnf)
        and not sampling_params.structural_tag
    )
    return (
        plain
        and not req.return_logprob
        and not getattr(req, "return_hidden_states", False)
        and getattr(req, "custom_logit_processor", None) is None
        and req.grammar is None
    )
