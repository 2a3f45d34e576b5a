"""Verification of tokens decoded on the anchor: which to keep, what comes next.

During the anchor phase a request decodes on approximate (anchor-only) KV.
Its output is ``[t0, t1, ..., tn]``: ``t0`` came from the exact prefill, the
rest are speculative. The verify pass recomputes, on full-precision KV, the
token that should follow each of ``t0 .. t(n-1)``; call them ``p1 .. pn``.

Greedy: keep ``t1 .. tj`` for the longest ``j`` with ``ti == pi``; if
``j < n`` the full-precision token ``p(j+1)`` replaces ``t(j+1)`` and the
rest is discarded. Sampling uses the same rule on tokens drawn with shared
noise (`lynx.sampling`), so the rule is the same for both.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Verdict:
    """Outcome of verifying one request's speculative tokens.

    Attributes:
        output_ids: the verified output, ``[t0, t1 .. tj]`` plus ``p(j+1)``
            when a speculative token was rejected.
        accepted: ``j``, speculative tokens kept.
        speculative: ``n``, speculative tokens verified.
    """

    output_ids: tuple[int, ...]
    accepted: int
    speculative: int

    @property
    def rolled_back(self) -> bool:
        return self.accepted < self.speculative


def accepted_prefix(draft: Sequence[int], predicted: Sequence[int]) -> int:
    """Length of the longest prefix on which `draft` equals `predicted`."""
    count = 0
    for drafted, wanted in zip(draft, predicted):
        if drafted != wanted:
            break
        count += 1
    return count


def verify(output_ids: Sequence[int], predicted: Sequence[int]) -> Verdict:
    """Verify ``output_ids = [t0 .. tn]`` against ``predicted = [p1 .. pn]``.

    Raises:
        ValueError: `predicted` does not have one entry per speculative token.
    """
    speculative = len(output_ids) - 1
    if speculative < 0:
        raise ValueError("output_ids must hold at least the prefill's first token")
    if len(predicted) != speculative:
        raise ValueError(f"{speculative} speculative tokens but {len(predicted)} predictions")
    accepted = accepted_prefix(output_ids[1:], predicted)
    kept = tuple(output_ids[: 1 + accepted])
    if accepted < speculative:
        kept += (int(predicted[accepted]),)
    return Verdict(kept, accepted, speculative)


class DraftWindow:
    """How long a decode server can usefully draft on a request's anchor: its speculative cap
    times its recent decode step (an exponential average of the time between scheduler
    iterations that ran a batch). The prefill sends that request's residual within it.

    Args:
        cap: tokens a request may draft before it waits for its residual.
        first_step_s: the step assumed before one is measured.
        smoothing: weight of each new step in the average (0..1].
    """

    def __init__(self, cap: int, first_step_s: float = 0.05, smoothing: float = 0.2) -> None:
        if cap < 0 or not first_step_s > 0 or not 0 < smoothing <= 1:
            raise ValueError(f"need cap >= 0, first_step_s > 0, 0 < smoothing <= 1; got {cap}, {first_step_s}, {smoothing}")
        self.cap, self.step_s, self._smoothing = cap, first_step_s, smoothing
        self._last: float | None = None

    def tick(self, now: float, running: bool) -> None:
        """One scheduler iteration at `now`; `running`: it runs a batch (its time until the next
        tick is one step; an idle iteration's is not)."""
        if self._last is not None:
            self.step_s += self._smoothing * (now - self._last - self.step_s)
        self._last = now if running else None

    @property
    def seconds(self) -> float:
        return self.cap * self.step_s
