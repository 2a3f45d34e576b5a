from lynx_testing.judge import Answer, judge, top_two


def _top2(first, second, gap=1.0):
    return ((first, -1.0), (second, -1.0 - gap))


def _reference(prompt, outputs, top2):
    return Answer(tuple(prompt), tuple(outputs), tuple(top2))


def _never(prefix, n):
    raise AssertionError(f"the reference was asked to continue from {prefix}")


def test_equal_answers_are_counted_token_by_token_without_asking_the_reference_again():
    ref = _reference([1, 2], [5, 6, 7], [_top2(5, 9), _top2(6, 9), _top2(7, 9)])
    tally = judge([Answer((1, 2), (5, 6, 7))], [ref], _never)
    assert (tally.equal, tally.tokens, tally.wrong, tally.continuations) == (1, 3, 0, 0)


def test_tokens_after_a_near_tie_are_judged_against_the_reference_continued_from_the_candidate():
    ref = _reference([1], [5, 6, 7], [_top2(5, 9), _top2(6, 8, gap=0.01), _top2(7, 9)])
    asked = []

    def continued(prompt, n):
        asked.append((prompt, n))
        return [4], [_top2(4, 9)]

    good = judge([Answer((1,), (5, 8, 4))], [ref], continued)
    assert (good.equal_after_ties, good.wrong) == (1, 0)
    assert asked == [([1, 5, 8], 1)]
    assert [(p.position, p.kind) for p in good.partings] == [(1, "near_tie")]

    bad = judge([Answer((1,), (5, 8, 3))], [ref], lambda prompt, n: ([4], [_top2(4, 9)]))
    assert bad.wrong == 1 and not bad.ok
    assert [(p.position, p.kind) for p in bad.partings] == [(1, "near_tie"), (2, "mismatch")]


def test_a_parting_wider_than_a_near_tie_is_wrong_with_its_gap():
    ref = _reference([1], [5, 6], [_top2(5, 9), _top2(6, 8, gap=0.3)])
    tally = judge([Answer((1,), (5, 8))], [ref], _never)
    assert tally.wrong == 1
    assert abs(tally.partings[0].gap - 0.3) < 1e-9


def test_a_candidate_without_a_reference_answer_is_never_counted_equal():
    tally = judge([Answer((3,), (5,))], [_reference([1], [5], [_top2(5, 9)])], _never)
    assert (tally.unmatched, tally.equal, tally.ok) == (1, 0, False)


def test_top_two_reads_sglangs_logprob_triples():
    assert top_two([[[-0.1, 5, "a"], [-2.0, 9, "b"]]]) == [((5, -0.1), (9, -2.0))]
