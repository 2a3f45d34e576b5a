import math

from lynx_testing.exactness import (
    compare_greedy,
    compare_greedy_resynced,
    compare_sampled,
    sampling_pit,
    settle_bf16_parting,
)


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


def test_a_wide_bf16_parting_stands_when_the_fp32_model_picks_the_candidates_token():
    top2 = [_top2(1, 9), _top2(2, 7, gap=0.375)]
    mismatch = compare_greedy([1, 2], [1, 7], top2, max_gap=0.125)
    asked = []

    def exact(prefix, choice):
        asked.append(prefix)
        return choice

    settled = settle_bf16_parting(mismatch, [1, 7], lambda p: exact(p, _top2(7, 2, gap=0.3)))
    assert (settled.verdict, settled.position) == ("near_tie", 1)
    assert asked == [[1]]
    # The fp32 model holding the two within bf16's rounding settles it too.
    assert settle_bf16_parting(mismatch, [1, 7], lambda p: _top2(2, 7, gap=0.27)).ok


def test_a_wide_bf16_parting_the_fp32_model_disagrees_with_stays_a_mismatch():
    top2 = [_top2(1, 9), _top2(2, 7, gap=0.375)]
    mismatch = compare_greedy([1, 2], [1, 7], top2, max_gap=0.125)
    for fp32 in (_top2(2, 7, gap=0.6), _top2(2, 5, gap=0.0)):
        settled = settle_bf16_parting(mismatch, [1, 7], lambda p, fp32=fp32: fp32)
        assert settled.verdict == "mismatch" and "fp32 top-2" in settled.detail
    # Lengths that differ are never settled by a model.
    short = compare_greedy([1, 2], [1], [_top2(1, 9)] * 2)
    assert settle_bf16_parting(short, [1], lambda p: _top2(1, 9)) is short


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

    vocab, seed = 50, 3
    noise = gumbel_noise(seed, 1, vocab)
    # Choose reference logprobs so tokens 4 and 9 tie exactly after the noise at position 1.
    tied = {4: -1.0, 9: -1.0 + float(noise[4]) - float(noise[9])}
    far = {4: -1.0, 9: tied[9] - 1.0}
    ok = compare_sampled([7, 4], [7, 9], [{7: -0.1}, tied], seed, vocab)
    assert (ok.verdict, ok.position) == ("near_tie", 1)
    assert compare_sampled([7, 4], [7, 9], [{7: -0.1}, far], seed, vocab).verdict == "mismatch"
    assert compare_sampled([7, 4], [7, 8], [{7: -0.1}, tied], seed, vocab).verdict == "mismatch"
    assert compare_sampled([7, 4], [7, 4], [{}, {}], seed, vocab).verdict == "equal"


def _draws(probs: dict[int, float], n: int, rng) -> list[int]:
    tokens = list(probs)
    return list(rng.choice(tokens, size=n, p=[probs[t] for t in tokens]))


def test_pit_of_correct_samples_is_uniform_and_of_greedy_or_wrong_temperature_is_not():
    import numpy as np
    from scipy.stats import kstest

    rng = np.random.default_rng(0)
    probs = {7: 0.5, 3: 0.25, 9: 0.15, 4: 0.06}  # 0.04 left for the rest of the vocabulary
    logprobs = {t: math.log(p) for t, p in probs.items()}
    full = {**probs, 1000: 0.04}
    right = sampling_pit(_draws(full, 400, rng), [logprobs] * 400, rng.random)
    assert kstest(right, "uniform").pvalue > 0.01
    greedy = sampling_pit([7] * 400, [logprobs] * 400, rng.random)
    assert kstest(greedy, "uniform").pvalue < 1e-6
    hot = {t: p ** 0.5 for t, p in full.items()}  # sampled at temperature 2, claimed 1
    hot = {t: p / sum(hot.values()) for t, p in hot.items()}
    wrong = sampling_pit(_draws(hot, 400, rng), [logprobs] * 400, rng.random)
    assert kstest(wrong, "uniform").pvalue < 1e-3
