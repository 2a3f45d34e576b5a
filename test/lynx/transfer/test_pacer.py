"""Token-bucket accounting with a fake clock (no sleeping)."""

import pytest

from lynx.transfer.pacer import TokenBucket, Unpaced, make_pacer


def send_all(pacer, sizes, start=0.0):
    """Sleep (on a fake clock) exactly each returned wait; return the send times."""
    now, times = start, []
    for size in sizes:
        now += pacer.reserve(size, now)
        times.append(now)
    return times


def test_burst_goes_at_once_then_bytes_wait_for_the_rate():
    bucket = TokenBucket(rate_bytes_per_s=1000.0, burst_bytes=3000)
    assert send_all(bucket, [1000, 1000, 1000, 1000, 500]) == [0.0, 0.0, 0.0, 1.0, 1.5]


def test_chunk_larger_than_the_burst_waits_for_its_deficit():
    bucket = TokenBucket(rate_bytes_per_s=1000.0, burst_bytes=100)
    assert bucket.reserve(600, now=5.0) == 0.5


def test_long_run_average_is_exactly_the_rate():
    rate, burst, chunk = 1024.0, 4096, 512
    bucket = TokenBucket(rate, burst)
    times = send_all(bucket, [chunk] * 1000, start=10.0)
    total = chunk * 1000
    assert times[-1] - 10.0 == (total - burst) / rate
    assert (total - burst) / (times[-1] - 10.0) == rate


def test_idle_time_refills_only_up_to_the_burst():
    bucket = TokenBucket(rate_bytes_per_s=100.0, burst_bytes=200)
    assert bucket.reserve(200, now=0.0) == 0.0
    assert bucket.reserve(200, now=1000.0) == 0.0
    assert bucket.reserve(100, now=1000.0) == 1.0


def test_caller_that_sends_late_is_not_penalized_and_not_rewarded_past_the_burst():
    bucket = TokenBucket(rate_bytes_per_s=100.0, burst_bytes=100)
    assert bucket.reserve(100, now=0.0) == 0.0
    assert bucket.reserve(100, now=0.0) == 1.0
    assert bucket.reserve(100, now=3.0) == 0.0
    assert bucket.reserve(100, now=3.0) == 1.0


def test_zero_burst_makes_every_chunk_wait_its_serialization_time():
    bucket = TokenBucket(rate_bytes_per_s=100.0, burst_bytes=0)
    assert send_all(bucket, [100, 50, 200], start=2.0) == [3.0, 3.5, 5.5]
    assert bucket.reserve(100, now=100.0) == 1.0


def test_clock_stepping_back_refills_nothing():
    bucket = TokenBucket(rate_bytes_per_s=100.0, burst_bytes=0)
    assert bucket.reserve(100, now=10.0) == 1.0
    assert bucket.reserve(100, now=5.0) == 2.0


def test_unpaced_never_waits():
    assert send_all(Unpaced(), [1 << 30] * 5) == [0.0] * 5


def test_make_pacer_converts_gbps_to_bytes_per_second():
    assert isinstance(make_pacer(0, burst_bytes=1), Unpaced)
    bucket = make_pacer(8.0, burst_bytes=0)
    assert bucket.rate_bytes_per_s == 1e9
    assert bucket.reserve(10**9, now=0.0) == 1.0


@pytest.mark.parametrize("rate", [0, -1.0, float("inf"), float("nan")])
def test_invalid_rates_are_value_errors(rate):
    with pytest.raises(ValueError):
        TokenBucket(rate, 10)


def test_invalid_burst_and_link_are_value_errors():
    with pytest.raises(ValueError):
        TokenBucket(1.0, -1)
    with pytest.raises(ValueError):
        make_pacer(-1.0, 10)
    with pytest.raises(ValueError):
        TokenBucket(1.0, 10).reserve(-1, 0.0)
