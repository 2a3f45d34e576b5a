"""Applying a verify pass to a request: roll back its drafts, replay what full precision chose.

The replay is SGLang's own per-token step (`process_batch_result_decode`):
append the token, update the finish state (stop tokens, stop strings and
regexes, length, grammar termination), record its logprobs, advance the
grammar, stopping at the token that finishes the request. Running it token
by token, rather than accepting a run at once, keeps every finish rule
exactly as step-by-step decoding applies it.
"""

from __future__ import annotations

import logging
from http import HTTPStatus

from lynx.speculation import Verdict, verify

from lynx_patches.speculate.predict import Choice
from lynx_patches.speculate.verify import Span, free_tail
from lynx_patches.targets import LOGPROB_LISTS

logger = logging.getLogger(__name__)


def apply(scheduler, span: Span, choices: list[Choice]) -> Verdict:
    """Keep the drafts of `span` that agree with `choices`, then full precision's correction.

    The request ends with its verified tokens, the agreeing drafts and the
    correction, as far as a finish rule lets it; the KV slots past them are freed.
    """
    req = span.req
    verdict = verify(req.output_ids[span.start : span.start + span.count + 1], [c.token for c in choices])
    roll_back(req, span.start + 1)
    replay(req, list(verdict.output_ids[1:]), choices[: len(verdict.output_ids) - 1])
    free_tail(scheduler, req, len(req.origin_input_ids) + len(req.output_ids) - 1)
    return verdict


def roll_back(req, keep: int) -> None:
    """Drop every output token from index `keep` on, with its logprobs."""
    del req.output_ids[keep:]
    if req.return_logprob:
        for name in LOGPROB_LISTS:
            values = getattr(req.logprob, name)
            if values is not None:
                del values[keep:]


def replay(req, tokens: list[int], choices: list[Choice]) -> int:
    """Append `tokens` one by one as a decode step would; returns how many were appended."""
    from sglang.srt.managers.schedule_batch import FINISH_ABORT

    appended = 0
    for token, choice in zip(tokens, choices, strict=True):
        req.output_ids.append(token)
        appended += 1
        req.update_finish_state()
        if req.return_logprob:
            _append_logprobs(req, token, choice)
        if req.grammar is not None:
            try:
                if not req.grammar.is_terminated():
                    req.grammar.accept_token(token)
            except ValueError as exc:
                logger.error("Grammar accept_token failed for req %s with token %s: %s", req.rid, token, exc)
                req.to_finish = FINISH_ABORT(f"Grammar accept_token failed: {exc}", HTTPStatus.INTERNAL_SERVER_ERROR)
                break  # the next step finishes the request with the abort, as in SGLang
            req.grammar.finished = req.finished()
        if req.finished():
            break
    return appended


def _append_logprobs(req, token: int, choice: Choice) -> None:
    logprob = req.logprob
    logprob.output_token_logprobs_val.append(choice.logprob)
    logprob.output_token_logprobs_idx.append(token)
    if choice.top is not None:
        logprob.output_top_logprobs_val.append(choice.top[0])
        logprob.output_top_logprobs_idx.append(choice.top[1])
    if choice.token_ids is not None:
        logprob.output_token_ids_logprobs_val.append(choice.token_ids[0])
        logprob.output_token_ids_logprobs_idx.append(choice.token_ids[1])
