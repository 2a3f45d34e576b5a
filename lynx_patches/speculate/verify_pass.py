"""One batched verify pass, step by step, over requests whose residual landed with drafts held back.

`open_span` rewinds a request's grammar to its verified tokens and names its
rows; `choose` runs the forward over every request's rows (`verify`) and picks
each position's token as step-by-step decoding would (`predict`); `settle`
keeps one request's agreeing drafts and the correction (`commit`) and counts
them. Each stage's seconds go to the request's `profile`. Which phase a
request moves to, and what then happens to it, is the controller's.
"""

from __future__ import annotations

import time

from lynx_patches.speculate import commit
from lynx_patches.speculate.predict import Choice, predict
from lynx_patches.speculate.state import state_of
from lynx_patches.speculate.verify import Span, verify_logits


def open_span(req) -> Span:
    """The rows of `req` in a verify pass (its held-back tokens, from its last verified one), with
    its grammar rolled back over the drafts it accepted, to the verified tokens."""
    state = state_of(req)
    accepted = state.grammar_drafts(len(req.output_ids))
    if req.grammar is not None and accepted:
        req.grammar.rollback(accepted)
    state.grammar_end = None  # rolled back to the verified tokens: the grammar accepts again
    return Span(req, state.verified - 1, state.speculated(len(req.output_ids)))


def choose(scheduler, spans: list[Span]) -> list[list[Choice]]:
    """Full precision's choice at every row of `spans`, in one forward; raises what the pass raised."""
    started = time.perf_counter()
    logits = verify_logits(scheduler, spans)
    forward_done = time.perf_counter()
    choices = predict(scheduler, spans, logits)
    predict_done = time.perf_counter()
    for span in spans:
        state = state_of(span.req)
        state.verify_batch = len(spans)
        state.profile["forward_s"] = forward_done - started
        state.profile["predict_s"] = predict_done - forward_done
    return choices


def settle(scheduler, span: Span, choices: list[Choice]) -> None:
    """Keep the drafts of `span` that agree with `choices` and the correction; count them on the
    request's state, whose every output token is verified after this."""
    started = time.perf_counter()
    req, state = span.req, state_of(span.req)
    verdict = commit.apply(scheduler, span, choices)
    state.speculative_tokens += verdict.speculative
    state.accepted_tokens += verdict.accepted
    state.rollbacks += int(verdict.rolled_back)
    state.verified = len(req.output_ids)
    state.profile["commit_s"] = time.perf_counter() - started
