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


def test_without_a_continuation_the_tokens_after_a_near_tie_are_counted_unchecked_never_equal():
    from lynx_testing.judge import judge_pair

    ref = _reference([1], [5, 6, 7, 8], [_top2(5, 9), _top2(6, 8, gap=0.01), _top2(7, 9), _top2(8, 9)])
    tally = judge_pair(Answer((1,), (5, 8, 3, 3)), ref, None)
    assert (tally.equal, tally.equal_after_ties, tally.unchecked, tally.wrong) == (0, 1, 2, 0)
    assert "2 tokens after a tie unchecked" in tally.summary()
    wrong = judge_pair(Answer((1,), (4, 6, 7, 8)), ref, None, index=3)
    assert wrong.wrong == 1 and wrong.partings[0].request == 3 and wrong.partings[0].kind == "mismatch"


def test_a_seeded_sample_parting_at_a_perturbed_tie_is_a_near_tie_and_the_rest_unchecked():
    from lynx.sampling import gumbel_noise
    from lynx_testing.judge import judge_sampled

    noise = gumbel_noise(7, 1, 16)
    # Token 3 and token 4 perturbed to within 0.001 of each other at position 1.
    logprobs = [{2: -0.1}, {3: -1.0, 4: -1.0 + float(noise[3] - noise[4]) + 0.001}, {5: -0.1}]
    tie = judge_sampled([2, 4, 9], [2, 3, 5], logprobs, seed=7, vocab_size=16)
    assert (tie.equal_after_ties, tie.unchecked, tie.wrong) == (1, 1, 0)
    assert judge_sampled([2, 3, 5], [2, 3, 5], logprobs, seed=7, vocab_size=16).equal == 1
    assert judge_sampled([9, 3, 5], [2, 3, 5], logprobs, seed=7, vocab_size=16).wrong == 1


def test_continuations_keep_stateless_parameters_and_refuse_state_kept_in_the_output():
    from lynx_testing.judge import continuation_params

    assert continuation_params({"temperature": 0, "max_new_tokens": 9, "stop": ["."]}, 3) == {
        "temperature": 0, "ignore_eos": True}  # fmt: skip
    assert continuation_params({"logit_bias": {"30": -100.0}, "min_new_tokens": 12}, 5) == {
        "temperature": 0, "ignore_eos": True, "logit_bias": {"30": -100.0}, "min_new_tokens": 7}  # fmt: skip
    assert continuation_params({"min_new_tokens": 2}, 5)["min_new_tokens"] == 0
    for state in ({"repetition_penalty": 1.3}, {"frequency_penalty": 0.8}, {"json_schema": "{}"}, {"regex": "a+"}):
        assert continuation_params(state, 0) is None, state
    assert continuation_params({"repetition_penalty": 1.0, "regex": None}, 0) is not None


def test_a_request_continuation_asks_the_server_for_the_tokens_left_with_top_two():
    from lynx_testing.judge import answer_of, request_continuation

    sent = []

    def post(url, body):
        sent.append((url, body))
        return {"output_ids": [4], "meta_info": {"output_top_logprobs": [[[-0.1, 4, None], [-2.0, 9, None]]]}}

    generate = request_continuation(post, "http://r", {"min_new_tokens": 4}, prompt_tokens=2)
    assert generate([1, 2, 5], 1) == ([4], [((4, -0.1), (9, -2.0))])
    url, body = sent[0]
    assert url == "http://r/generate" and body["input_ids"] == [1, 2, 5] and body["top_logprobs_num"] == 2
    assert body["sampling_params"] == {"temperature": 0, "ignore_eos": True, "min_new_tokens": 3, "max_new_tokens": 1}
    assert request_continuation(post, "http://r", {"ebnf": "root ::= x"}, 2) is None
    answer = answer_of([1, 2], post("http://r", {}))
    assert answer == Answer((1, 2), (4,), (((4, -0.1), (9, -2.0)),))
