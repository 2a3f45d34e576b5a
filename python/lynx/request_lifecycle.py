"""The lifecycle of a request on a decode server: one `Phase`, changed only by `advance`.

A request whose KV comes in two streams starts ``FRESH`` (its anchor has
landed, its residual has not); one whose KV came in one stream starts
``EXACT``. The phases, in order:

* ``FRESH``: adopted in this scheduler iteration; the iteration streams its
  first token (computed by the prefill on full KV), and its residual is
  first looked at after that, once the next batch is formed.
* ``FRESH_PARKED``: ``FRESH``, and already parked in this iteration (it may
  not speculate, so Lynx streamed its first token and took it out of the
  engine's queues).
* ``DRAFTING``: decoding on anchor KV in the engine's queues; its tokens past
  the verified ones are held back.
* ``PARKED``: outside the engine's queues until its residual lands: it
  drafted its cap, or it may not speculate.
* ``VERIFYING``: its residual is applied; its held-back tokens are being
  checked by the verify pass.
* ``REQUEUED``: verified and back in the engine's waiting queue; the
  penalizer rows of the batch that takes it up are owed its history.
* ``EXACT`` (terminal): its KV is full precision and its output verified; it
  decodes like any request.
* ``FAILED`` (terminal): its residual or its verify pass failed; it ends
  with the reason.

A request that finishes leaves the controller in the phase it finished in
(an aborted ``PARKED`` request, say): finishing is the engine's state, not a
phase. `TRANSITIONS` is the whole table; `advance` is the one place it is
applied.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from types import MappingProxyType

from lynx.lifecycle import RefusedTransition, move


class Phase(enum.Enum):
    FRESH = "fresh"
    FRESH_PARKED = "fresh_parked"
    DRAFTING = "drafting"
    PARKED = "parked"
    VERIFYING = "verifying"
    REQUEUED = "requeued"
    EXACT = "exact"
    FAILED = "failed"

    @property
    def on_anchor(self) -> bool:
        """Its KV is anchor-only: tokens past the verified ones are held back and may not finish it."""
        return self in ON_ANCHOR

    @property
    def fresh(self) -> bool:
        """Adopted in this scheduler iteration."""
        return self in (Phase.FRESH, Phase.FRESH_PARKED)

    @property
    def parked(self) -> bool:
        """Held outside the engine's queues."""
        return self in (Phase.FRESH_PARKED, Phase.PARKED)

    @property
    def awaits_residual(self) -> bool:
        """On anchor past its first iteration (drafting or parked): each iteration polls its residual."""
        return self in (Phase.DRAFTING, Phase.PARKED)


ON_ANCHOR = frozenset({Phase.FRESH, Phase.FRESH_PARKED, Phase.DRAFTING, Phase.PARKED})

TRANSITIONS: Mapping[Phase, frozenset[Phase]] = MappingProxyType({
    Phase.FRESH: frozenset({Phase.DRAFTING, Phase.FRESH_PARKED}),
    Phase.FRESH_PARKED: frozenset({Phase.PARKED}),
    Phase.DRAFTING: frozenset({Phase.PARKED, Phase.VERIFYING, Phase.EXACT, Phase.FAILED}),
    Phase.PARKED: frozenset({Phase.VERIFYING, Phase.EXACT, Phase.FAILED}),
    Phase.VERIFYING: frozenset({Phase.REQUEUED, Phase.EXACT, Phase.FAILED}),
    Phase.REQUEUED: frozenset({Phase.EXACT}),
    Phase.EXACT: frozenset(),
    Phase.FAILED: frozenset(),
})
"""The phases each phase may move to; every other move is refused."""


def first_phase(residual_pending: bool) -> Phase:
    """The phase of a request adopted with its anchor landed: ``FRESH`` while a residual is to come."""
    return Phase.FRESH if residual_pending else Phase.EXACT


def advance(current: Phase, to: Phase) -> Phase:
    """`to`, if `TRANSITIONS` allows the move from `current`.

    Raises:
        RefusedTransition: the table does not allow it.
    """
    return move(TRANSITIONS, current, to, "a decode request")


def settle_target(current: Phase) -> Phase:
    """Where a fresh phase moves once its first iteration is over: ``FRESH`` drafts, ``FRESH_PARKED`` stays parked."""
    return Phase.PARKED if current is Phase.FRESH_PARKED else Phase.DRAFTING


def park_target(current: Phase) -> Phase:
    """Where a phase moves when its request is parked: a fresh one to ``FRESH_PARKED``, else to ``PARKED``."""
    return Phase.FRESH_PARKED if current.fresh else Phase.PARKED
