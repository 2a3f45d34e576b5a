"""`RankAgreement`: the decode ranks' one all-reduce per residual decision (fake lockstep group, and real gloo)."""

from __future__ import annotations

import pytest
from pd_fakes import LockstepGroup, gloo_agreement_rank, run_ranks

from lynx_patches.speculate.agree import RankAgreement, Readiness

READY, PENDING, FAILED = Readiness.READY, Readiness.PENDING, Readiness.FAILED


def test_a_request_is_ready_only_where_every_rank_is_ready_and_failed_where_any_rank_failed():
    group = LockstepGroup(2)
    views = [[READY, READY, PENDING, READY], [READY, PENDING, FAILED, FAILED]]
    agreed = run_ranks([0, 1], lambda rank: group.agreement(rank).agree(views[rank]))
    assert agreed == [[READY, PENDING, FAILED, FAILED]] * 2


def test_each_failure_reason_is_the_ranks_own_or_the_first_other_ranks():
    group = LockstepGroup(3)
    local = [["timed out", None], [None, None], [None, "prefill died"]]
    reasons = run_ranks([0, 1, 2], lambda rank: group.agreement(rank).reasons(local[rank]))
    assert reasons[0] == ["timed out", "prefill died (on another decode rank)"]
    assert reasons[1] == ["timed out (on another decode rank)", "prefill died (on another decode rank)"]
    assert reasons[2] == ["timed out (on another decode rank)", "prefill died"]


def test_a_single_rank_agrees_with_itself_and_an_empty_list_never_reaches_the_group():
    assert RankAgreement.solo().agree([PENDING, READY]) == [PENDING, READY]
    assert RankAgreement.solo().reasons(["lost"]) == ["lost"]

    def refuse(_):
        raise AssertionError("a collective for nothing")

    assert RankAgreement(refuse, refuse, 2).agree([]) == []


def test_a_scheduler_without_a_tp_group_is_a_single_rank():
    assert RankAgreement.of(object()).size == 1


@pytest.mark.slow
def test_two_processes_agree_over_a_real_gloo_group():
    import multiprocessing

    from lynx_deploy.processes import free_port

    context = multiprocessing.get_context("spawn")
    out = context.Queue()
    views = [[READY, PENDING], [READY, READY]]
    port = free_port()
    procs = [context.Process(target=gloo_agreement_rank, args=(rank, port, views, out)) for rank in range(2)]
    for proc in procs:
        proc.start()
    results = sorted(out.get(timeout=120) for _ in procs)
    for proc in procs:
        proc.join(timeout=30)
    assert results == [
        (0, 2, [0, 1], ["lost here (on another decode rank)"]),
        (1, 2, [0, 1], ["lost here"]),
    ]
