"""Opening a verify span: the grammar is rolled back over exactly the drafts it accepted."""

from __future__ import annotations

from types import SimpleNamespace

from lynx.request_lifecycle import Phase

from lynx_patches.speculate.state import SpecState
from lynx_patches.speculate.verify import Span
from lynx_patches.speculate.verify_pass import open_span


class Grammar:
    """Accepts tokens until it has accepted `ends_after` of them; records its rollbacks."""

    def __init__(self, accepted, ends_after=None):
        self.accepted, self.ends_after, self.rolled_back = list(accepted), ends_after, []

    def is_terminated(self):
        return self.ends_after is not None and len(self.accepted) >= self.ends_after

    def rollback(self, k):
        self.rolled_back.append(k)
        del self.accepted[-k:]


def drafting(output_ids, grammar, verified=1):
    state = SpecState(room=1, verified=verified, cap=8, phase=Phase.VERIFYING)
    return SimpleNamespace(output_ids=list(output_ids), grammar=grammar, lynx=state)


def test_a_grammar_that_never_terminated_is_rolled_back_over_every_draft():
    req = drafting([7, 1, 2, 3], Grammar([7, 1, 2, 3]))
    req.lynx.watch_grammar(req.grammar, 4)
    assert open_span(req) == Span(req, 0, 3) and req.grammar.rolled_back == [3] and req.grammar.accepted == [7]


def test_a_grammar_that_terminated_among_the_drafts_is_rolled_back_over_those_before_its_end():
    grammar = Grammar([7, 1], ends_after=3)
    req = drafting([7, 1], grammar)
    req.lynx.watch_grammar(grammar, 2)
    assert req.lynx.grammar_end is None
    grammar.accepted.append(9)  # the draft that terminates it
    req.output_ids.append(9)
    req.lynx.watch_grammar(grammar, 3)
    req.output_ids += [4, 5]  # drafted on, refused by the terminated grammar
    req.lynx.watch_grammar(grammar, 5)
    assert req.lynx.grammar_end == 3 and req.lynx.grammar_drafts(5) == 2
    assert open_span(req) == Span(req, 0, 4)
    assert grammar.rolled_back == [2] and grammar.accepted == [7] and req.lynx.grammar_end is None


def test_a_grammar_that_ended_at_the_verified_tokens_is_not_rolled_back():
    grammar = Grammar([7], ends_after=1)
    req = drafting([7, 1, 2], grammar)
    req.lynx.watch_grammar(grammar, 1)
    assert open_span(req) == Span(req, 0, 2) and grammar.rolled_back == []


def test_a_request_without_a_grammar_opens_its_span_untouched():
    req = drafting([7, 1, 2], None, verified=2)
    req.lynx.watch_grammar(None, 3)
    assert open_span(req) == Span(req, 1, 1) and req.lynx.grammar_end is None
