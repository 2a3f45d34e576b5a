"""What step-by-step decoding would emit at each verified position, from the verify pass's logits.

SGLang turns a decode step's logits into a token in this order: penalties
(frequency, presence, repetition, `min_new_tokens`) from the tokens so far,
the grammar's mask for its current state, `logit_bias`, then the sampler,
which also computes the logprobs a request asked for. The verify pass has the
logits of several positions of several requests at once; `predict` gives
each row the state step-by-step decoding had there and runs SGLang's own
code on all rows together:

* penalizer rows rebuilt from each position's history (SGLang's penalizers
  only accumulate, so a row is built by feeding it the tokens before it);
* grammar masks filled by walking each request's grammar along its drafted
  tokens, then rolled back (as SGLang's speculative decoding does);
* the sampler, with Lynx's seeded draw for sampled requests
  (`hooks.sampler_forward`), so the logprobs are SGLang's too.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from lynx_patches.speculate.state import coupled_rows, state_of
from lynx_patches.speculate.verify import Span


class Choice(NamedTuple):
    """The token at one position and, when the request asked, its logprobs (SGLang's formats)."""

    token: int
    logprob: float | None = None
    top: tuple[list, list] | None = None
    token_ids: tuple[list, list] | None = None


class _Rows:
    """The minimal batch SGLang's sampling state reads: requests (one per row) and a device."""

    def __init__(self, reqs: list, device) -> None:
        self.reqs, self.device = reqs, device


def predict(scheduler, spans: list[Span], logits: torch.Tensor) -> list[list[Choice]]:
    """Per span, the choice after each of its rows (``span.count`` choices)."""
    from sglang.srt.layers.logits_processor import LogitsProcessorOutput
    from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo

    reqs = [span.req for span in spans for _ in range(span.count)]
    positions = [span.start + 1 + i for span in spans for i in range(span.count)]
    device = logits.device
    rows = _Rows(reqs, device)
    vocab = scheduler.model_config.vocab_size
    info = SamplingBatchInfo.from_schedule_batch(rows, vocab)
    if info.penalizer_orchestrator.is_required:
        histories = [span.req.output_ids[: span.start + 1 + i] for span in spans for i in range(span.count)]
        info.penalizer_orchestrator = penalizer_rows(vocab, rows, histories)
    info.grammar_mask = grammar_masks(spans, vocab, device)
    # A verify row draws the token after its own position, not after the request's whole output.
    seeded = coupled_rows(reqs, _seeded)
    info.lynx_coupled_rows = [(row, rule, seed, positions[row]) for row, rule, seed, _ in seeded]
    logits = logits.float()
    info.apply_logits_bias(logits)
    output = LogitsProcessorOutput(next_token_logits=logits)
    return_logprob = any(req.return_logprob for req in reqs)
    tokens = scheduler.tp_worker.model_runner.sampler(
        output,
        info,
        return_logprob,
        [req.logprob.top_logprobs_num if req.return_logprob else 0 for req in reqs],
        [req.logprob.token_ids_logprob if req.return_logprob else None for req in reqs],
        torch.tensor(positions, dtype=torch.int64, device=device),
    ).tolist()
    choices = [_choice(row, req, tokens[row], output) for row, req in enumerate(reqs)]
    out, start = [], 0
    for span in spans:
        out.append(choices[start : start + span.count])
        start += span.count
    return out


def _seeded(req) -> tuple | None:
    state = state_of(req)
    return (state.rule, state.seed) if state is not None and state.rule is not None else None


def _choice(row: int, req, token: int, output) -> Choice:
    if not req.return_logprob:
        return Choice(int(token))
    top = token_ids = None
    if req.logprob.top_logprobs_num > 0:
        top = (_list(output.next_token_top_logprobs_val[row]), _list(output.next_token_top_logprobs_idx[row]))
    if req.logprob.token_ids_logprob is not None:
        token_ids = (_list(output.next_token_token_ids_logprobs_val[row]), _list(output.next_token_token_ids_logprobs_idx[row]))
    return Choice(int(token), float(output.next_token_logprobs[row]), top, token_ids)


def _list(value) -> list:
    return value.tolist() if torch.is_tensor(value) else list(value)


def penalizer_rows(vocab_size: int, batch, histories: list) -> object:
    """A penalizer orchestrator for `batch` whose row i has been fed ``histories[i]``.

    SGLang's orchestrator feeds one token to every row at once, so each row is
    built on its own one-request orchestrator and the rows are then merged in
    order. Every row prepares each penalizer that any row of `batch` needs
    (SGLang's merge would otherwise prepare a missing one for the first
    request only, leaving it short of rows); for a request that does not ask
    for a penalty, the prepared penalizer changes nothing.
    """
    from sglang.srt.sampling import penaltylib
    from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo  # noqa: F401 (penaltylib's import order)

    classes = {
        penaltylib.BatchedFrequencyPenalizer,
        penaltylib.BatchedMinNewTokensPenalizer,
        penaltylib.BatchedPresencePenalizer,
        penaltylib.BatchedRepetitionPenalizer,
    }
    everyone = penaltylib.BatchedPenalizerOrchestrator(vocab_size=vocab_size, batch=batch, penalizers=classes)
    needed = [cls for cls, penalizer in everyone.penalizers.items() if penalizer.is_prepared()]
    everyone.release()
    holders, merged = [], None
    for req, history in zip(batch.reqs, histories, strict=True):
        holder = _Rows([req], batch.device)
        holders.append(holder)  # orchestrators keep only a weak reference to their batch
        row = penaltylib.BatchedPenalizerOrchestrator(vocab_size=vocab_size, batch=holder, penalizers=classes)
        for cls in needed:
            row.penalizers[cls].prepare()
        row.is_required = bool(needed)
        for token in history:
            row.cumulate_output_tokens(torch.tensor([int(token)], dtype=torch.int64, device=batch.device))
        if merged is None:
            merged = row
        else:
            merged.merge(row)
    merged.batch = batch
    return merged


def grammar_masks(spans: list[Span], vocab_size: int, device):
    """SGLang's `GrammarMask` for the verify rows, or None when no request has a grammar.

    Row i of a span is masked by the request's grammar after its output up to
    ``start + i``: the grammar (which holds the verified tokens only, see
    `SpecController`) walks the drafted tokens filling one row each, then
    steps back. A grammar that terminated, or rejected a draft, leaves the
    later rows unconstrained (a rejected draft is rolled back by the row before).
    """
    from sglang.srt.constrained.base_grammar_backend import GrammarMask

    grammars = [span.req.grammar for span in spans if span.req.grammar is not None]
    if not grammars:
        return None
    total = sum(span.count for span in spans)
    mask = grammars[0].allocate_vocab_mask(vocab_size=vocab_size, batch_size=total, device="cpu")
    first = 0
    for span in spans:
        grammar = span.req.grammar
        if grammar is not None:
            walk_drafts(grammar, span.req.output_ids[span.start + 1 : span.start + span.count], mask, first)
        first += span.count
    return GrammarMask(grammars[0], grammars[0].move_vocab_mask(mask, device))


def walk_drafts(grammar, drafts, mask, first: int) -> None:
    """Fill rows ``first ..`` of `mask` along `drafts`; the grammar ends where it began."""
    accepted = 0
    for i in range(len(drafts) + 1):
        if grammar.is_terminated():
            break
        grammar.fill_vocab_mask(mask, first + i)
        if i == len(drafts):
            break
        try:
            grammar.accept_token(int(drafts[i]))
        except ValueError:
            break
        accepted += 1
    if accepted:
        grammar.rollback(accepted)
