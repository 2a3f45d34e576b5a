"""Per-position sampling state of a verify pass, against SGLang's own step-by-step state.

Penalizer rows are checked with SGLang's real penalizers: a row rebuilt from
a history must hold what an orchestrator that decoded those tokens one by
one holds. Grammar masks are checked with a small scripted grammar.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from lynx_patches.speculate.predict import _Rows, penalizer_rows, walk_drafts

VOCAB = 12


class _Tokenizer:
    eos_token_id = 11
    additional_stop_token_ids = None


def _req(**params):
    defaults = dict(frequency_penalty=0.0, presence_penalty=0.0, repetition_penalty=1.0, min_new_tokens=0,
                    stop_token_ids=set())  # fmt: skip
    return SimpleNamespace(sampling_params=SimpleNamespace(**{**defaults, **params}), eos_token_ids={11},
                           tokenizer=_Tokenizer())  # fmt: skip


def _step_by_step(req, history, logits):
    """What SGLang's decode applies after feeding `history` one token per step."""
    from sglang.srt.sampling import penaltylib

    batch = _Rows([req], "cpu")
    classes = {penaltylib.BatchedFrequencyPenalizer, penaltylib.BatchedMinNewTokensPenalizer,
               penaltylib.BatchedPresencePenalizer, penaltylib.BatchedRepetitionPenalizer}  # fmt: skip
    orchestrator = penaltylib.BatchedPenalizerOrchestrator(vocab_size=VOCAB, batch=batch, penalizers=classes)
    for token in history:
        orchestrator.cumulate_output_tokens(torch.tensor([token]))
    out = logits.clone()[None]
    orchestrator.apply(out)
    return out[0]


@pytest.mark.parametrize(
    "params",
    [
        dict(frequency_penalty=0.7),
        dict(presence_penalty=1.1),
        dict(repetition_penalty=1.3),
        dict(min_new_tokens=3),
        dict(frequency_penalty=0.4, presence_penalty=0.2, repetition_penalty=1.2, min_new_tokens=2),
    ],
)
@pytest.mark.parametrize("plain_first", [False, True], ids=["penalized-first", "plain-first"])
def test_each_row_is_penalized_as_after_decoding_its_history_token_by_token(params, plain_first):
    """Rows of requests without a penalty may come before those with one (a batched verify pass)."""
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(VOCAB, generator=g) * 3
    plain = _req()
    penalized = _req(**params)
    if plain_first:
        histories = [[2], [3, 5], [4], [4, 7], [4, 7, 4], [4, 7, 4, 11]]
        reqs = [plain, plain] + [penalized] * 4
    else:
        histories = [[4], [4, 7], [4, 7, 4], [4, 7, 4, 11], [2]]
        reqs = [penalized] * 4 + [plain]
    batch = _Rows(reqs, "cpu")
    orchestrator = penalizer_rows(VOCAB, batch, histories)
    rows = logits.repeat(len(reqs), 1)
    orchestrator.apply(rows)
    for i, (req, history) in enumerate(zip(reqs, histories, strict=True)):
        torch.testing.assert_close(rows[i], _step_by_step(req, history, logits), rtol=0, atol=0)
    assert orchestrator.batch is batch


class _Grammar:
    """Accepts a fixed sequence; the mask allows only the next token of it (or anything once done)."""

    def __init__(self, accepted: list[int], sequence: list[int]):
        self.sequence, self.pos = sequence, len(accepted)

    def is_terminated(self):
        return self.pos >= len(self.sequence)

    def fill_vocab_mask(self, mask, row):
        mask[row] = 0
        mask[row, self.sequence[self.pos]] = 1

    def accept_token(self, token):
        if token != self.sequence[self.pos]:
            raise ValueError(f"token {token} not allowed")
        self.pos += 1

    def rollback(self, k):
        self.pos -= k


def test_masks_follow_the_drafts_and_the_grammar_ends_where_it_began():
    grammar = _Grammar([5], [5, 1, 2, 3, 9])
    mask = torch.full((4, VOCAB), 7)
    walk_drafts(grammar, [1, 2, 3], mask, 0)
    assert [int(row.argmax()) for row in mask] == [1, 2, 3, 9]
    assert grammar.pos == 1


def test_a_draft_the_grammar_rejects_leaves_later_rows_unconstrained():
    grammar = _Grammar([5], [5, 1, 2, 3, 9])
    mask = torch.full((4, VOCAB), 7)
    walk_drafts(grammar, [1, 8, 3], mask, 0)
    assert [int(row.argmax()) for row in mask[:2]] == [1, 2]
    assert (mask[2:] == 7).all() and grammar.pos == 1


def test_a_grammar_that_terminates_inside_the_drafts_stops_masking():
    grammar = _Grammar([5], [5, 1, 2])
    mask = torch.full((4, VOCAB), 7)
    walk_drafts(grammar, [1, 2, 6], mask, 0)
    assert [int(row.argmax()) for row in mask[:2]] == [1, 2]
    assert (mask[2:] == 7).all() and grammar.pos == 1
