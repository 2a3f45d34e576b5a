"""Rolling a request back to its verified tokens and replaying full precision's choice, logprobs included."""

from __future__ import annotations

from types import SimpleNamespace

from lynx_patches.speculate import commit
from lynx_patches.speculate.predict import Choice
from lynx_patches.speculate.verify import Span

EOS = 0


class Req:
    """SGLang's `Req` as the replay uses it: output, logprob lists, finish on EOS or length."""

    def __init__(self, output_ids, max_new_tokens=64, top=True):
        self.rid, self.output_ids, self.origin_input_ids = "r", list(output_ids), list(range(10))
        self.finished_reason, self.to_finish, self.grammar, self.return_logprob = None, None, None, True
        self.sampling_params = SimpleNamespace(max_new_tokens=max_new_tokens)
        n = len(output_ids)
        self.logprob = SimpleNamespace(
            top_logprobs_num=2 if top else 0, token_ids_logprob=[5],
            output_token_logprobs_val=[-0.1 * i for i in range(n)], output_token_logprobs_idx=list(output_ids),
            output_top_logprobs_val=[[-0.1, -2.0]] * n, output_top_logprobs_idx=[[t, 9] for t in output_ids],
            output_token_ids_logprobs_val=[[-3.0]] * n, output_token_ids_logprobs_idx=[[5]] * n,
        )  # fmt: skip

    def finished(self):
        return self.finished_reason is not None

    def update_finish_state(self, new_accepted_len=1):
        if self.output_ids[-1] == EOS:
            self.finished_reason = "stop"
        elif len(self.output_ids) >= self.sampling_params.max_new_tokens:
            self.finished_reason = "length"


def _choice(token, logprob):
    return Choice(token, logprob, ([logprob, -5.0], [token, 8]), ([-4.0], [5]))


def test_a_rollback_drops_the_drafts_and_their_logprobs():
    req = Req([7, 1, 2, 3])
    commit.roll_back(req, 1)
    assert req.output_ids == [7]
    assert all(len(getattr(req.logprob, name)) == 1 for name in commit.LOGPROB_LISTS)


def test_apply_keeps_agreeing_drafts_adds_the_correction_with_full_precision_logprobs(monkeypatch):
    freed = []
    monkeypatch.setattr(commit, "free_tail", lambda scheduler, req, keep: freed.append(keep))
    req = Req([7, 1, 9, 3])
    choices = [_choice(1, -0.5), _choice(2, -0.7), _choice(4, -0.9)]
    verdict = commit.apply(None, Span(req, 0, 3), choices)
    assert (verdict.accepted, verdict.rolled_back) == (1, True)
    assert req.output_ids == [7, 1, 2] and freed == [10 + 3 - 1]
    log = req.logprob
    assert log.output_token_logprobs_val == [0.0, -0.5, -0.7] and log.output_token_logprobs_idx == [7, 1, 2]
    assert log.output_top_logprobs_idx == [[7, 9], [1, 8], [2, 8]]
    assert log.output_token_ids_logprobs_val == [[-3.0], [-4.0], [-4.0]]


def test_the_replay_stops_at_the_token_that_finishes_the_request(monkeypatch):
    monkeypatch.setattr(commit, "free_tail", lambda scheduler, req, keep: None)
    req = Req([7, 1, EOS, 3])
    commit.apply(None, Span(req, 0, 3), [_choice(1, -0.1), _choice(EOS, -0.2), _choice(3, -0.3)])
    assert req.output_ids == [7, 1, EOS] and req.finished_reason == "stop"
    assert req.logprob.output_token_logprobs_idx == [7, 1, EOS], "the finishing token keeps its logprob"


def test_a_token_the_grammar_refuses_aborts_at_the_next_step_as_in_sglang(monkeypatch):
    monkeypatch.setattr(commit, "free_tail", lambda scheduler, req, keep: None)

    class Refusing:
        finished = False

        def is_terminated(self):
            return False

        def accept_token(self, token):
            if token == 2:
                raise ValueError("not in the grammar")

    req = Req([7, 1, 2, 3])
    req.grammar = Refusing()
    commit.apply(None, Span(req, 0, 3), [_choice(1, -0.1), _choice(2, -0.2), _choice(3, -0.3)])
    assert req.output_ids == [7, 1, 2] and req.to_finish is not None and not req.finished()
