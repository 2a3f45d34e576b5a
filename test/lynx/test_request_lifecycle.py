"""The decode request's lifecycle table, move by move: every allowed move is taken, every other refused."""

from __future__ import annotations

import subprocess
import sys
from itertools import product

import pytest

from lynx.request_lifecycle import (
    ON_ANCHOR,
    TRANSITIONS,
    Phase,
    RefusedTransition,
    advance,
    first_phase,
    park_target,
    settle_target,
)

P = Phase
ALLOWED = {
    (P.FRESH, P.DRAFTING),
    (P.FRESH, P.FRESH_PARKED),
    (P.FRESH_PARKED, P.PARKED),
    (P.DRAFTING, P.PARKED),
    (P.DRAFTING, P.VERIFYING),
    (P.DRAFTING, P.EXACT),
    (P.DRAFTING, P.FAILED),
    (P.PARKED, P.VERIFYING),
    (P.PARKED, P.EXACT),
    (P.PARKED, P.FAILED),
    (P.VERIFYING, P.REQUEUED),
    (P.VERIFYING, P.EXACT),
    (P.VERIFYING, P.FAILED),
    (P.REQUEUED, P.EXACT),
}
MOVES = list(product(Phase, Phase))


def test_the_table_holds_exactly_the_allowed_moves():
    assert {(a, b) for a, targets in TRANSITIONS.items() for b in targets} == ALLOWED
    assert set(TRANSITIONS) == set(Phase)


@pytest.mark.parametrize(("current", "to"), sorted(ALLOWED, key=str), ids=str)
def test_an_allowed_move_returns_its_target(current, to):
    assert advance(current, to) is to


@pytest.mark.parametrize(("current", "to"), [m for m in MOVES if m not in ALLOWED], ids=str)
def test_every_other_move_is_refused_naming_both_phases(current, to):
    with pytest.raises(RefusedTransition, match=f"from {current.name} to {to.name}"):
        advance(current, to)


def test_exact_and_failed_are_terminal_and_every_phase_reaches_one():
    assert TRANSITIONS[P.EXACT] == TRANSITIONS[P.FAILED] == frozenset()
    for phase in Phase:
        seen, todo = set(), [phase]
        while todo:
            seen.add(now := todo.pop())
            todo += [nxt for nxt in TRANSITIONS[now] if nxt not in seen]
        assert P.EXACT in seen or phase is P.FAILED, phase


def test_every_phase_is_reachable_from_a_first_phase():
    reached, todo = set(), [first_phase(True), first_phase(False)]
    while todo:
        reached.add(now := todo.pop())
        todo += [nxt for nxt in TRANSITIONS[now] if nxt not in reached]
    assert reached == set(Phase)


def test_a_request_starts_fresh_while_its_residual_is_to_come_else_exact():
    assert first_phase(True) is P.FRESH and first_phase(False) is P.EXACT


def test_the_phases_on_anchor_parked_fresh_and_awaiting_their_residual():
    assert ON_ANCHOR == {P.FRESH, P.FRESH_PARKED, P.DRAFTING, P.PARKED}
    assert {p for p in Phase if p.on_anchor} == ON_ANCHOR
    assert {p for p in Phase if p.parked} == {P.FRESH_PARKED, P.PARKED}
    assert {p for p in Phase if p.fresh} == {P.FRESH, P.FRESH_PARKED}
    assert {p for p in Phase if p.awaits_residual} == {P.DRAFTING, P.PARKED}


def test_settling_and_parking_pick_an_allowed_move_from_the_phases_they_apply_to():
    assert [settle_target(p) for p in (P.FRESH, P.FRESH_PARKED)] == [P.DRAFTING, P.PARKED]
    assert [park_target(p) for p in (P.FRESH, P.DRAFTING)] == [P.FRESH_PARKED, P.PARKED]
    for phase in (P.FRESH, P.FRESH_PARKED):
        advance(phase, settle_target(phase))
    for phase in (P.FRESH, P.DRAFTING):
        advance(phase, park_target(phase))


def test_a_parked_request_is_never_parked_again():
    for phase in (P.FRESH_PARKED, P.PARKED):
        with pytest.raises(RefusedTransition):
            advance(phase, park_target(phase))


def test_the_lifecycle_imports_nothing_from_the_engine():
    code = "import sys, lynx.request_lifecycle; print('sglang' in sys.modules, 'torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["False", "False"]
