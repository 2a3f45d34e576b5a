"""`--lynx-mode auto`'s rule: one stream where the link keeps up with the prefill, progressive where not."""

import pytest
from lynx.auto import ONE_STREAM, PROGRESSIVE, LinkView, PrefillRate, choose
from lynx.config import LynxConfig


@pytest.mark.parametrize(
    ("queued", "own", "rate", "prefill_s", "expected"),
    [
        (0, 100, 100.0, 1.0, ONE_STREAM),  # the request's bytes take exactly its prefill
        (0, 101, 100.0, 1.0, PROGRESSIVE),  # a little longer: the anchor first wins time
        (50, 60, 100.0, 1.0, PROGRESSIVE),  # idle alone, but behind a queue it would wait
        (50, 40, 100.0, 1.0, ONE_STREAM),
        (0, 1, None, 1.0, PROGRESSIVE),  # unpaced: the rate is unknown
        (0, 1, 100.0, None, PROGRESSIVE),  # no prefill timed yet
    ],
)
def test_one_stream_only_where_queue_and_request_leave_within_the_prefill(queued, own, rate, prefill_s, expected):
    assert choose(LinkView(queued, rate), own, prefill_s) == expected


def test_the_prefill_rate_averages_finished_requests_and_ignores_unknown_ones():
    rate = PrefillRate(smoothing=0.5)
    assert rate.seconds(100) is None
    rate.started(1, 1000, now=10.0)
    rate.started(1, 5, now=11.0)  # a later segment of the same room changes nothing
    rate.finished(1, now=12.0)  # 1000 tokens in 2 s
    assert rate.seconds(500) == pytest.approx(1.0)
    rate.started(2, 1000, now=20.0)
    rate.finished(2, now=21.0)  # 1000 tokens/s: the average moves halfway
    assert rate.tokens_per_s == pytest.approx(750.0)
    rate.finished(3, now=30.0)  # never started: no effect
    rate.started(4, 10, now=40.0)
    rate.forget(4)
    rate.finished(4, now=41.0)
    assert rate.tokens_per_s == pytest.approx(750.0)


def test_auto_mode_takes_the_int8_preset_and_receives_both_formats():
    config = LynxConfig(mode="auto")
    assert set(config.wires) == {"int8", "lynx"} and config.speculates
    assert config.wires["int8"].num_streams == 1 and config.wires["lynx"].num_streams == 2
    with pytest.raises(ValueError, match="int8 preset"):
        LynxConfig(mode="auto", preset="int16")
