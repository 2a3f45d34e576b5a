"""Polling residuals on the scheduler thread: apply what has landed of each request's residual on
this rank, then agree with the other decode ranks which requests are ready, pending or failed."""

from __future__ import annotations

import time
from typing import NamedTuple

from lynx.pd.consumer import DecodeSideView

from lynx_patches.speculate.agree import RankAgreement, Readiness
from lynx_patches.speculate.state import SpecState, state_of


class Polled(NamedTuple):
    """One poll of a list of requests, as every decode rank of the group agreed it.

    Attributes:
        ready: requests whose residual every rank has applied, in the order polled.
        failed: ``(request, this rank's failure reason or None)`` of each request
            whose residual failed on some rank.
        waiting_on_peers: a residual applied here that another rank still waits for.
    """

    ready: list
    failed: list[tuple[object, str | None]]
    waiting_on_peers: bool


class ResidualPoll:
    """Polls the residuals of a decode rank's requests in lockstep with the other ranks.

    Args:
        side: the rank's decode side (`check`, `room_state`, `apply_residual`).
        agreement: the decode ranks' agreement (`agree.RankAgreement`).
    """

    def __init__(self, side: DecodeSideView, agreement: RankAgreement) -> None:
        self.side, self.agreement = side, agreement

    def poll(self, reqs: list) -> Polled:
        """Apply what has landed of each request's residual on this rank, then agree with the other ranks.

        Every rank calls this in the same iteration with the same requests in
        the same order (the controller's state is alike on every rank), so the
        one all-reduce inside lines up.
        """
        local, reasons = [], []
        for req in reqs:
            state = state_of(req)
            failure = self.side.check(state.room)
            if failure is None and self.side.room_state(state.room) is None:
                failure = "the transfer was lost"
            reasons.append(failure)
            local.append(Readiness.FAILED if failure is not None else self._upgrade(state))
        agreed = self.agreement.agree(local)
        return Polled(
            ready=[req for req, group in zip(reqs, agreed) if group is Readiness.READY],
            failed=[(req, own) for req, group, own in zip(reqs, agreed, reasons) if group is Readiness.FAILED],
            waiting_on_peers=any(
                own is Readiness.READY and group is Readiness.PENDING for own, group in zip(local, agreed)
            ),
        )

    def reasons(self, failed: list[tuple[object, str | None]]) -> list[str]:
        """The reason of each of a poll's `failed` requests, this rank's own or another rank's
        (every rank calls this with the same requests; none costs nothing)."""
        return self.agreement.reasons([own for _, own in failed]) if failed else []

    def _upgrade(self, state: SpecState) -> Readiness:
        """Apply what has landed of the residual (segment by segment), timed as ``upgrade_s``."""
        started = time.perf_counter()
        done = self.side.apply_residual(state.room)
        state.profile["upgrade_s"] = state.profile.get("upgrade_s", 0.0) + time.perf_counter() - started
        return Readiness.READY if done else Readiness.PENDING
