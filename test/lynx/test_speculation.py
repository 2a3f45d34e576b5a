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


def test_the_draft_window_is_the_cap_times_the_averaged_step_and_idle_gaps_do_not_count():
    from lynx.speculation import DraftWindow

    window = DraftWindow(cap=10, first_step_s=0.1, smoothing=0.5)
    assert window.seconds == pytest.approx(1.0)
    window.tick(0.0, running=True)
    window.tick(0.3, running=False)  # one step of 0.3 s: 0.1 + 0.5 * 0.2
    assert window.step_s == pytest.approx(0.2)
    window.tick(100.0, running=True)  # the idle gap before it is not a step
    assert window.step_s == pytest.approx(0.2)
    window.tick(100.2, running=True)
    assert window.seconds == pytest.approx(2.0)
    with pytest.raises(ValueError):
        DraftWindow(cap=-1)
