"""`--lynx-mode auto`: per request, one full stream where the link keeps up, progressive streams where not.

Both choices carry the same bytes (the `int8` preset's two stages): `int8`
joins them into one stream, which the decode server decodes once it is
whole; `lynx` sends the anchor first and lets the decode server draft on it
while the residual follows. Progressive streams buy an earlier first token
only when the request's KV would land later than its prefill ends: the
rule compares the time the link needs for what is queued ahead plus this
request's bytes with the time the prefill needs for this request. Where the
link keeps up, one stream costs nothing and spares the decode server a
verify pass and the drafts a rollback throws away.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import NamedTuple

ONE_STREAM, PROGRESSIVE = "int8", "lynx"
REMEMBERED = 4096  # requests whose prefill start is kept while they compute


class LinkView(NamedTuple):
    """What the prefill's sender knows of its link when a request is announced."""

    queued_bytes: int
    bytes_per_s: float | None  # None: unpaced, rate unknown


def choose(link: LinkView, request_bytes: int, prefill_s: float | None) -> str:
    """`ONE_STREAM` if the link sends what is queued plus this request's bytes within the
    request's prefill time, else `PROGRESSIVE` (also when the rate or the prefill time is
    not known yet)."""
    if not link.bytes_per_s or prefill_s is None:
        return PROGRESSIVE
    transfer_s = (link.queued_bytes + request_bytes) / link.bytes_per_s
    return ONE_STREAM if transfer_s <= prefill_s else PROGRESSIVE


class PrefillRate:
    """The prefill's own throughput in prompt tokens per second: an exponential average over
    finished requests, each timed from its first encoded segment to its metadata (the end of
    its last prefill chunk).

    Args:
        smoothing: weight of each new request (0..1].
    """

    def __init__(self, smoothing: float = 0.3) -> None:
        if not 0 < smoothing <= 1:
            raise ValueError(f"smoothing must be in (0, 1], got {smoothing!r}")
        self._smoothing = smoothing
        self.tokens_per_s: float | None = None
        self._started: OrderedDict[int, tuple[float, int]] = OrderedDict()

    def started(self, room: int, tokens: int, now: float) -> None:
        """The room's first segment is being encoded (its prefill has begun)."""
        if room not in self._started:
            self._started[room] = (now, tokens)
            while len(self._started) > REMEMBERED:
                self._started.popitem(last=False)

    def finished(self, room: int, now: float) -> None:
        """The room's prefill is done (its metadata is being sent)."""
        start = self._started.pop(room, None)
        if start is None or now <= start[0]:
            return
        rate = start[1] / (now - start[0])
        self.tokens_per_s = rate if self.tokens_per_s is None else self.tokens_per_s + self._smoothing * (rate - self.tokens_per_s)

    def forget(self, room: int) -> None:
        self._started.pop(room, None)

    def seconds(self, tokens: int) -> float | None:
        """Estimated prefill time of a `tokens`-token prompt, None before a request was timed."""
        return None if not self.tokens_per_s else tokens / self.tokens_per_s
