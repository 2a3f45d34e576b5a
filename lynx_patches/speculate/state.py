"""Per-request Lynx state on a decode server (lives on the SGLang `Req` as `req.lynx`)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import logging

from lynx.request_lifecycle import Phase, advance, first_phase
from lynx.sampling import SamplingRule

logger = logging.getLogger(__name__)

ATTR = "lynx"
# Drafts a grammar request may hold: its grammar is rolled back over them,
# and grammar backends bound how far back they go (xgrammar: 200 tokens).
GRAMMAR_MAX_DRAFTS = 128


@dataclass
class SpecState:
    """Where a ``lynx``-mode request stands.

    Attributes:
        room: the request's bootstrap room (its transfer on this decode rank).
        verified: leading output tokens that are exact (streamable); the rest
            were generated on the anchor and are held back.
        cap: speculative tokens allowed before the request waits (0 = none).
        phase: where the request is in its lifecycle (`lynx.request_lifecycle`);
            changed only by `move`.
        grammar_end: the output length at which the request's grammar was
            first seen terminated, None while it accepts tokens. A position in
            the output, like `verified`, not a phase: no move of the lifecycle
            reads it (a request whose grammar has terminated drafts, parks and
            is verified like any other, up to its cap); it bounds
            `grammar_drafts`, the count the verify pass rolls the grammar back
            by, since a terminated grammar accepted none of the later drafts.
        rule: the sampling distribution; None for greedy decoding.
        seed: seeds the Gumbel noise of every sampled token (`lynx.sampling`).
        barred_from_tree: the request's own `skip_radix_cache_insert`, which
            the anchor phase overrides (anchor KV must never enter the tree).
        timings: the transfer's milestones (seconds from the request's arrival).
        profile: seconds spent per verify stage (`upgrade_s`, `forward_s`, ...),
            this request's share of its batched pass.
    """

    room: int
    verified: int
    cap: int
    rule: SamplingRule | None = None
    seed: int = 0
    barred_from_tree: bool = False
    phase: Phase = Phase.FRESH
    grammar_end: int | None = None
    speculative_tokens: int = 0
    accepted_tokens: int = 0
    rollbacks: int = 0
    verify_batch: int = 0
    timings: dict = field(default_factory=dict)
    profile: dict = field(default_factory=dict)

    def move(self, to: Phase) -> None:
        """Move to phase `to` (`lynx.request_lifecycle.advance` refuses a move its table does not allow)."""
        self.phase = advance(self.phase, to)

    def speculated(self, output_len: int) -> int:
        """Held-back tokens of an output of `output_len` tokens."""
        return output_len - self.verified

    def watch_grammar(self, grammar, output_len: int) -> None:
        """Look at the request's grammar (None: it has none) with `output_len` tokens out; the first
        time it is terminated, that length is `grammar_end`."""
        if grammar is not None and self.grammar_end is None and grammar.is_terminated():
            self.grammar_end = output_len

    def grammar_drafts(self, output_len: int) -> int:
        """Held-back tokens of an output of `output_len` tokens that the grammar accepted: those
        before `grammar_end`, or all of them while it accepts."""
        return (output_len if self.grammar_end is None else self.grammar_end) - self.verified

    def metrics(self) -> dict:
        return {
            "speculative_tokens": self.speculative_tokens,
            "accepted_tokens": self.accepted_tokens,
            "rollbacks": self.rollbacks,
            "verify_batch": self.verify_batch,
            "verify_s": round(sum(self.profile.values()), 6),
            **{k: round(v, 6) for k, v in self.profile.items()},
        }


def adopted_state(req, residual_pending: bool, timings: dict, max_drafts: int) -> SpecState:
    """The state of a request adopted with its anchor landed: ``FRESH`` while a residual is to come,
    allowed `max_drafts` drafts unless `why_not_speculate` names a reason (then none)."""
    reason = why_not_speculate(req)
    cap = 0 if reason is not None else max_drafts
    if req.grammar is not None:
        cap = min(cap, GRAMMAR_MAX_DRAFTS)
    state = SpecState(
        room=req.bootstrap_room,
        verified=len(req.output_ids),
        cap=cap,
        rule=sampling_rule(req.sampling_params),
        seed=noise_seed(req),
        timings=dict(timings),
        phase=first_phase(residual_pending),
    )
    if state.phase.on_anchor and reason is not None:
        logger.info("Lynx decode: request %s waits for its residual: %s", req.rid, reason)
    return state


def state_of(req) -> SpecState | None:
    return getattr(req, ATTR, None)


def in_anchor_phase(req) -> bool:
    state = state_of(req)
    return state is not None and state.phase.on_anchor


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


def request_seed(req) -> int | None:
    """The seed of the request's Gumbel noise; None when the request names none.

    The samples of one ``n > 1`` request share its `sampling_seed`; each is
    given its own seed from its transfer room (`parallel.sample_room`), alike
    on the prefill and the decode server, so the samples differ.
    """
    params = req.sampling_params
    if params.sampling_seed is None:
        return None
    seed = int(params.sampling_seed)
    if getattr(params, "n", 1) > 1 and req.bootstrap_room is not None:
        digest = hashlib.blake2b(f"{seed}:{req.bootstrap_room}".encode(), digest_size=8).digest()
        seed = int.from_bytes(digest, "little") & ((1 << 63) - 1)
    return seed


def noise_seed(req) -> int:
    """The seed of the request's Gumbel noise on a decode server: its `request_seed`, else one
    derived from its transfer room and request id (random per request, and alike on every
    decode rank of a tensor-parallel group, which must draw the same tokens)."""
    seed = request_seed(req)
    if seed is not None:
        return seed
    digest = hashlib.blake2b(f"lynx-noise:{req.bootstrap_room}:{req.rid}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


def why_not_speculate(req) -> str | None:
    """Why the verify pass cannot reproduce this request's output, or None if it can.

    Everything SGLang's sampler does per token is replayed at each verified
    position (penalties, `logit_bias`, `min_new_tokens`, grammars, logprobs,
    stop conditions). What the verify pass does not recompute keeps the
    request exact by waiting: it streams its first token at anchor time and
    decodes only once its residual has landed (docs/SERVING.md lists these).
    """
    if getattr(req, "custom_logit_processor", None) is not None:
        return "custom logit processor (it may keep per-request state across steps)"
    if getattr(req, "return_hidden_states", False):
        return "hidden states (each token's would have to be recomputed)"
    if getattr(req, "return_sampling_mask", False):
        return "sampling masks"
    if getattr(req, "require_reasoning", False):
        return "reasoning-token accounting"
    if getattr(req, "lora_id", None) is not None:
        return "LoRA adapters (untested here)"
    if getattr(req, "beam_group", None) is not None:
        return "beam search"
    grammar = getattr(req, "grammar", None)
    if grammar is not None and not _can_roll_back(grammar):
        return f"grammar backend {type(grammar).__name__} cannot roll back"
    return None


def _can_roll_back(grammar) -> bool:
    from sglang.srt.constrained.base_grammar_backend import BaseGrammarObject

    return type(grammar).rollback is not BaseGrammarObject.rollback
