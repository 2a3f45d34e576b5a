import math

import pytest
import torch

from lynx.sampling import SamplingRule, draw, gumbel_noise, sampling_logprobs


def test_noise_depends_only_on_seed_and_position():
    assert torch.equal(gumbel_noise(5, 3, 100), gumbel_noise(5, 3, 100))
    assert not torch.equal(gumbel_noise(5, 3, 100), gumbel_noise(5, 4, 100))
    assert not torch.equal(gumbel_noise(5, 3, 100), gumbel_noise(6, 3, 100))


def test_greedy_rule_takes_the_argmax():
    logits = torch.tensor([0.1, 3.0, 2.9])
    assert draw(logits, SamplingRule(top_k=1), seed=1, position=0) == 1


def test_top_k_and_top_p_exclude_tokens():
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    kept = sampling_logprobs(logits, SamplingRule(top_k=2)).isfinite()
    assert kept.tolist() == [True, True, False, False]
    kept = sampling_logprobs(logits, SamplingRule(top_p=0.7)).isfinite()
    assert kept.tolist() == [True, True, False, False]
    kept = sampling_logprobs(logits, SamplingRule(min_p=0.5)).isfinite()
    assert kept.tolist() == [True, True, False, False]


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_draws_follow_the_sampling_distribution(temperature):
    """Chi-square goodness of fit over 4000 seeds (critical value 16.27 = p 0.001, 3 dof)."""
    logits = torch.tensor([1.0, 0.5, 0.0, -1.0])
    rule = SamplingRule(temperature=temperature)
    expected = sampling_logprobs(logits, rule).exp()
    draws = 4000
    counts = torch.bincount(
        torch.tensor([draw(logits, rule, seed, position=7) for seed in range(draws)]), minlength=4
    ).double()
    chi2 = float(((counts - draws * expected) ** 2 / (draws * expected)).sum())
    assert chi2 < 16.27, (counts.tolist(), (draws * expected).tolist())
    assert math.isclose(float(expected.sum()), 1.0, rel_tol=1e-6)
