"""`ResidualPoll`: one poll applies what has landed on this rank, then takes the decode ranks' agreed view."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from lynx.request_lifecycle import Phase

from lynx_patches.speculate.agree import RankAgreement, Readiness
from lynx_patches.speculate.residuals import ResidualPoll
from lynx_patches.speculate.state import SpecState

READY, PENDING, FAILED = Readiness.READY, Readiness.PENDING, Readiness.FAILED


class Side:
    """A decode side's rooms: `applied` lists the rooms whose residual is all in, `gone` the lost ones."""

    def __init__(self, failures=None, applied=(), gone=()):
        self.failures, self.applied, self.gone, self.calls = failures or {}, set(applied), set(gone), []

    def check(self, room):
        return self.failures.get(room)

    def room_state(self, room):
        return None if room in self.gone else "anchored"

    def apply_residual(self, room):
        self.calls.append(room)
        return room in self.applied


def req(room):
    return SimpleNamespace(lynx=SpecState(room=room, verified=1, cap=3, phase=Phase.DRAFTING))


def with_peer(peer_view, peer_reasons=None):
    """An agreement of this rank with one other rank, whose view of the same requests is `peer_view`."""

    def reduce_max(flags):
        return [max(own, int(peer)) for own, peer in zip(flags, peer_view, strict=True)]

    def gather(obj):
        if peer_reasons is None:
            raise AssertionError("no failure to gather reasons for")
        return [obj, peer_reasons]

    return RankAgreement(reduce_max, gather, 2)


def test_a_poll_sorts_requests_into_ready_and_failed_with_this_ranks_reasons():
    side = Side(failures={3: "prefill out of memory"}, applied={1}, gone={4})
    reqs = [req(room) for room in (1, 2, 3, 4)]
    poll = ResidualPoll(side, RankAgreement.solo())
    polled = poll.poll(reqs)
    assert polled.ready == [reqs[0]] and not polled.waiting_on_peers
    assert polled.failed == [(reqs[2], "prefill out of memory"), (reqs[3], "the transfer was lost")]
    assert side.calls == [1, 2], "a failed request's residual is not applied"
    assert all("upgrade_s" in r.lynx.profile for r in reqs[:2]) and "upgrade_s" not in reqs[2].lynx.profile
    assert poll.reasons(polled.failed) == ["prefill out of memory", "the transfer was lost"]


def test_a_residual_applied_here_waits_for_a_peer_that_has_not_applied_its_own():
    reqs = [req(1), req(2)]
    polled = ResidualPoll(Side(applied={1, 2}), with_peer([READY, PENDING])).poll(reqs)
    assert polled.ready == [reqs[0]] and polled.failed == [] and polled.waiting_on_peers


def test_a_residual_that_failed_on_a_peer_fails_here_with_the_peers_reason():
    reqs = [req(1)]
    poll = ResidualPoll(Side(applied={1}), with_peer([FAILED], peer_reasons=["timed out"]))
    polled = poll.poll(reqs)
    assert polled.ready == [] and polled.failed == [(reqs[0], None)] and not polled.waiting_on_peers
    assert poll.reasons(polled.failed) == ["timed out (on another decode rank)"]


@pytest.mark.parametrize("peer", [PENDING, READY])
def test_no_failure_gathers_no_reasons(peer):
    poll = ResidualPoll(Side(), with_peer([peer]))
    assert poll.reasons(poll.poll([req(1)]).failed) == []
