import pytest

from lynx.speculation import accepted_prefix, verify


def test_all_speculative_tokens_accepted_keeps_output_without_bonus():
    verdict = verify([7, 1, 2, 3], [1, 2, 3])
    assert verdict.output_ids == (7, 1, 2, 3)
    assert (verdict.accepted, verdict.speculative, verdict.rolled_back) == (3, 3, False)


def test_first_mismatch_is_replaced_by_the_full_precision_token():
    verdict = verify([7, 1, 9, 3, 4], [1, 2, 5, 6])
    assert verdict.output_ids == (7, 1, 2)
    assert (verdict.accepted, verdict.speculative, verdict.rolled_back) == (1, 4, True)


def test_no_speculative_tokens_is_a_no_op():
    assert verify([7], []).output_ids == (7,)


def test_prediction_count_must_match():
    with pytest.raises(ValueError, match="predictions"):
        verify([7, 1, 2], [1])


def test_accepted_prefix_stops_at_first_difference():
    assert accepted_prefix([1, 2, 3, 4], [1, 2, 0, 4]) == 2
    assert accepted_prefix([], []) == 0
