"""Link emulation in the sender: a token bucket that says how long to wait before each chunk.

Pure with respect to time: callers pass ``now`` (seconds, any monotonic clock)
and do the sleeping themselves, so tests drive it with a fake clock.
"""

from __future__ import annotations

import math


class Unpaced:
    """A pacer that never waits (an unlimited link)."""

    def reserve(self, nbytes: int, now: float) -> float:
        """Always 0.0 seconds."""
        return 0.0


class TokenBucket:
    """Token bucket of ``rate_bytes_per_s`` refill and ``burst_bytes`` depth, starting full.

    ``reserve`` may drive the bucket into debt (a chunk larger than the burst
    still goes, after a wait), so from a full bucket, sending ``n`` bytes in
    total ends ``(n - burst_bytes) / rate_bytes_per_s`` seconds after the first
    reservation when the caller sleeps each returned wait: the long-run
    average is exactly the rate.
    """

    def __init__(self, rate_bytes_per_s: float, burst_bytes: int) -> None:
        if not isinstance(rate_bytes_per_s, (int, float)) or not 0 < rate_bytes_per_s < math.inf:
            raise ValueError(f"rate_bytes_per_s must be a positive finite number, got {rate_bytes_per_s!r}")
        if not isinstance(burst_bytes, int) or isinstance(burst_bytes, bool) or burst_bytes < 0:
            raise ValueError(f"burst_bytes must be a non-negative int, got {burst_bytes!r}")
        self.rate_bytes_per_s = float(rate_bytes_per_s)
        self.burst_bytes = burst_bytes
        self._tokens = float(burst_bytes)
        self._last: float | None = None

    def reserve(self, nbytes: int, now: float) -> float:
        """Account ``nbytes`` and return the seconds to wait (from ``now``) before they may go.

        A clock that steps backwards refills nothing.
        """
        if nbytes < 0:
            raise ValueError(f"nbytes must be >= 0, got {nbytes}")
        if self._last is not None and now > self._last:
            self._tokens = min(float(self.burst_bytes), self._tokens + (now - self._last) * self.rate_bytes_per_s)
        if self._last is None or now > self._last:
            self._last = now
        self._tokens -= nbytes
        return 0.0 if self._tokens >= 0 else -self._tokens / self.rate_bytes_per_s


def make_pacer(link_gbps: float, burst_bytes: int) -> Unpaced | TokenBucket:
    """``Unpaced()`` for ``link_gbps == 0``, else a bucket of ``link_gbps * 1e9 / 8`` bytes/s."""
    if not isinstance(link_gbps, (int, float)) or not math.isfinite(link_gbps) or link_gbps < 0:
        raise ValueError(f"link_gbps must be a finite number >= 0 (0 = unpaced), got {link_gbps!r}")
    if link_gbps == 0:
        return Unpaced()
    return TokenBucket(link_gbps * 1e9 / 8, burst_bytes)
