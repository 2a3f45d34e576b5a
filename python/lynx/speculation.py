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
