"""The prefill room's lifecycle table, event by event: every allowed move is taken, every other refused."""

from __future__ import annotations

import subprocess
import sys
from itertools import product

import pytest

from lynx.pd.prefill_lifecycle import (
    ENCODING_STATES,
    TRANSITIONS,
    PrefillEvent,
    PrefillRoomState,
    RefusedTransition,
    advance,
    allows,
)

S, E = PrefillRoomState, PrefillEvent
ALLOWED = {
    (S.UNCLAIMED, E.CLAIM): S.CLAIMED,
    (S.CLAIMED, E.START_ENCODING): S.ENCODING,
    (S.CLAIMED, E.ANNOUNCE): S.ANNOUNCED,
    (S.CLAIMED, E.ABORT): S.ABORTED,
    (S.ENCODING, E.END_ENCODING): S.CLAIMED,
    (S.ENCODING, E.ANNOUNCE): S.ANNOUNCED_ENCODING,
    (S.ENCODING, E.ABORT): S.ABORTED_ENCODING,
    (S.ANNOUNCED, E.START_ENCODING): S.ANNOUNCED_ENCODING,
    (S.ANNOUNCED, E.QUIET): S.CLAIMED,
    (S.ANNOUNCED, E.ABORT): S.ABORTED,
    (S.ANNOUNCED_ENCODING, E.END_ENCODING): S.ANNOUNCED,
    (S.ANNOUNCED_ENCODING, E.QUIET): S.ENCODING,
    (S.ANNOUNCED_ENCODING, E.ABORT): S.ABORTED_ENCODING,
    (S.ABORTED_ENCODING, E.END_ENCODING): S.ABORTED,
}
PAIRS = list(product(PrefillRoomState, PrefillEvent))


def test_the_table_holds_exactly_the_allowed_moves():
    assert dict(TRANSITIONS) == ALLOWED


@pytest.mark.parametrize(("current", "event"), sorted(ALLOWED, key=str), ids=str)
def test_an_allowed_event_moves_the_room_to_its_target(current, event):
    assert allows(current, event)
    assert advance(current, event) is ALLOWED[current, event]


@pytest.mark.parametrize(("current", "event"), [p for p in PAIRS if p not in ALLOWED], ids=str)
def test_every_other_event_is_refused_naming_state_and_event(current, event):
    assert not allows(current, event)
    with pytest.raises(RefusedTransition, match=f"{current.name} refuses {event.name}"):
        advance(current, event)


def test_every_state_is_reachable_from_unclaimed():
    reached, todo = set(), [S.UNCLAIMED]
    while todo:
        reached.add(now := todo.pop())
        todo += [to for (state, _), to in TRANSITIONS.items() if state is now and to not in reached]
    assert reached == set(PrefillRoomState)


def test_aborted_only_waits_for_the_release_and_no_state_returns_to_unclaimed():
    assert [event for state, event in TRANSITIONS if state is S.ABORTED] == []
    assert S.UNCLAIMED not in TRANSITIONS.values()


def test_an_encoding_state_ends_only_by_end_encoding_and_the_end_keeps_abort_and_announcement():
    for state in ENCODING_STATES:
        done = advance(state, E.END_ENCODING)
        assert not done.encoding and (done.aborted, done.alive) == (state.aborted, state.alive)
    for state in set(PrefillRoomState) - ENCODING_STATES:
        assert not allows(state, E.END_ENCODING)


def test_abort_stops_the_alive_messages_and_keeps_the_pages_busy_while_they_are_read():
    for state in PrefillRoomState:
        if allows(state, E.ABORT):
            aborted = advance(state, E.ABORT)
            assert aborted.aborted and not aborted.alive and aborted.encoding == state.encoding


def test_the_properties_of_each_state():
    assert {s for s in S if s.claimed} == set(S) - {S.UNCLAIMED}
    assert {s for s in S if s.encoding} == ENCODING_STATES == {S.ENCODING, S.ANNOUNCED_ENCODING, S.ABORTED_ENCODING}
    assert {s for s in S if s.aborted} == {S.ABORTED, S.ABORTED_ENCODING}
    assert {s for s in S if s.alive} == {S.ANNOUNCED, S.ANNOUNCED_ENCODING}


def test_the_lifecycle_imports_nothing_from_the_engine():
    code = "import sys, lynx.pd.prefill_lifecycle; print('sglang' in sys.modules, 'torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["False", "False"]
