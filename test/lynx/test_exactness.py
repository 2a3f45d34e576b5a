from lynx.exactness import compare_greedy, compare_greedy_resynced, compare_sampled


def _top2(first, second, gap=0.0):
    return ((first, -1.0), (second, -1.0 - gap))


def test_identical_outputs_are_equal():
    assert compare_greedy([1, 2, 3], [1, 2, 3], [_top2(1, 9)] * 3).verdict == "equal"


def test_parting_at_reference_second_choice_within_gap_is_near_tie():
    top2 = [_top2(1, 9), _top2(2, 7, gap=0.01), _top2(3, 9)]
    result = compare_greedy([1, 2, 3], [1, 7, 5], top2)
    assert (result.verdict, result.position) == ("near_tie", 1)


def test_parting_beyond_the_gap_is_a_mismatch():
    top2 = [_top2(1, 9), _top2(2, 7, gap=0.5)]
    assert compare_greedy([1, 2], [1, 7], top2).verdict == "mismatch"


def test_parting_at_a_token_outside_top2_is_a_mismatch():
    top2 = [_top2(1, 9), _top2(2, 7, gap=0.0)]
    assert compare_greedy([1, 2], [1, 8], top2).verdict == "mismatch"


def test_equal_prefix_with_different_lengths_is_a_mismatch():
    result = compare_greedy([1, 2, 3], [1, 2], [_top2(1, 9)] * 3)
    assert (result.verdict, result.position) == ("mismatch", 2)


def test_resync_checks_tokens_after_a_tie():
    # The reference would say 1, 2, 3, 4; at position 1 tokens 2 and 7 tie.
    # After the candidate took 7, a real reference continues 8, 9.
    def generate(prefix, n):
        path = {(): [1, 2, 3, 4], (1, 7): [8, 9]}[tuple(prefix)]
        top2 = [_top2(t, 7 if t == 2 else 0, gap=0.0 if t == 2 else 1.0) for t in path]
        return path[:n], top2[:n]

    ok = compare_greedy_resynced([1, 7, 8, 9], generate)
    assert ok.ok and [t.position for t in ok.ties] == [1]
    bad = compare_greedy_resynced([1, 7, 8, 5], generate)
    assert not bad.ok and bad.problem.position == 3


def test_sampled_parting_is_accepted_only_at_a_perturbed_near_tie():
    from lynx.sampling import gumbel_noise

    vocab, seed, temperature = 50, 3, 0.8
    noise = gumbel_noise(seed, 1, vocab)
    # Choose reference logprobs so tokens 4 and 9 tie exactly after the noise at position 1.
    tied = {4: -1.0, 9: temperature * (-1.0 / temperature + float(noise[4]) - float(noise[9]))}
    far = {4: -1.0, 9: tied[9] - 1.0}
    ok = compare_sampled([7, 4], [7, 9], [{7: -0.1}, tied], seed, temperature, vocab)
    assert (ok.verdict, ok.position) == ("near_tie", 1)
    assert compare_sampled([7, 4], [7, 9], [{7: -0.1}, far], seed, temperature, vocab).verdict == "mismatch"
    assert compare_sampled([7, 4], [7, 8], [{7: -0.1}, tied], seed, temperature, vocab).verdict == "mismatch"
    assert compare_sampled([7, 4], [7, 4], [{}, {}], seed, temperature, vocab).verdict == "equal"
