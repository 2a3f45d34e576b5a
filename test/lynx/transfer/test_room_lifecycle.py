"""The receiving room's lifecycle table, move by move: every allowed move is taken, every other refused."""

from __future__ import annotations

import subprocess
import sys
from itertools import product

import numpy as np
import pytest

from lynx.transfer.room_lifecycle import (
    ANCHOR_IN,
    LIVE,
    TRANSITIONS,
    UPGRADABLE,
    Owner,
    RefusedTransition,
    Room,
    RoomState,
    advance,
)

S = RoomState
ALLOWED = {
    (S.RESERVED, S.RECEIVING),
    (S.RESERVED, S.FAILED),
    (S.RESERVED, S.CLOSING),
    (S.RECEIVING, S.WRITING),
    (S.RECEIVING, S.FAILED),
    (S.RECEIVING, S.CLOSING),
    (S.WRITING, S.RECEIVING),
    (S.WRITING, S.ANCHORED),
    (S.WRITING, S.FAILED),
    (S.WRITING, S.CLOSING),
    (S.ANCHORED, S.LANDED),
    (S.ANCHORED, S.COMPLETE),
    (S.ANCHORED, S.FAILED),
    (S.ANCHORED, S.CLOSING),
    (S.LANDED, S.COMPLETE),
    (S.LANDED, S.FAILED),
    (S.LANDED, S.CLOSING),
    (S.COMPLETE, S.FAILED),
    (S.COMPLETE, S.CLOSING),
    (S.CLOSING, S.CLOSED),
}
MOVES = list(product(RoomState, RoomState))


def test_the_table_holds_exactly_the_allowed_moves():
    assert {(a, b) for a, targets in TRANSITIONS.items() for b in targets} == ALLOWED
    assert set(TRANSITIONS) == set(RoomState)


@pytest.mark.parametrize(("current", "to"), sorted(ALLOWED, key=str), ids=str)
def test_an_allowed_move_returns_its_target(current, to):
    assert advance(current, to) is to


@pytest.mark.parametrize(("current", "to"), [m for m in MOVES if m not in ALLOWED], ids=str)
def test_every_other_move_is_refused_naming_both_states(current, to):
    with pytest.raises(RefusedTransition, match=f"from {current.name} to {to.name}"):
        advance(current, to)


def test_failed_and_closed_are_terminal_and_every_state_reaches_both():
    assert TRANSITIONS[S.FAILED] == TRANSITIONS[S.CLOSED] == frozenset()
    for state in LIVE:
        seen, todo = set(), [state]
        while todo:
            seen.add(now := todo.pop())
            todo += [nxt for nxt in TRANSITIONS[now] if nxt not in seen]
        assert {S.FAILED, S.CLOSED} <= seen, state


def test_every_state_is_reachable_from_reserved_and_only_a_write_moves_back():
    reached, todo = set(), [S.RESERVED]
    while todo:
        reached.add(now := todo.pop())
        todo += [nxt for nxt in TRANSITIONS[now] if nxt not in reached]
    assert reached == set(RoomState)
    order = list(RoomState)
    backwards = {(a, b) for a, b in ALLOWED if order.index(b) < order.index(a)}
    assert backwards == {(S.WRITING, S.RECEIVING)}, "a segment's write returns to receiving the next"


def test_any_live_state_but_writing_fails_at_once_and_every_live_state_is_released_through_closing():
    for state in LIVE - {S.WRITING}:
        assert advance(state, S.FAILED) is S.FAILED
    for state in LIVE:
        assert advance(state, S.CLOSING) is S.CLOSING
        with pytest.raises(RefusedTransition):
            advance(state, S.CLOSED)
    assert TRANSITIONS[S.CLOSING] == {S.CLOSED}, "a release ends closed, whatever failed meanwhile"


def test_the_live_anchored_and_upgradable_states():
    assert LIVE == set(RoomState) - {S.CLOSING, S.FAILED, S.CLOSED}
    assert ANCHOR_IN == {S.ANCHORED, S.LANDED, S.COMPLETE}
    assert UPGRADABLE == {S.RECEIVING, S.ANCHORED, S.LANDED}
    assert {s for s in RoomState if s.live} == LIVE
    assert {s for s in RoomState if s.anchor_in} == ANCHOR_IN
    assert {s for s in RoomState if s.upgradable} == UPGRADABLE


def test_a_new_room_is_reserved_its_own_request_and_the_transfers():
    room = Room(7, np.arange(5), 2, b"k" * 32, 1.0, "prefill", b"n" * 16, ("tcp://a:1",))
    assert (room.state, room.request, room.part, room.owner) == (S.RESERVED, 7, 0, Owner.TRANSFER)
    assert room.num_tokens == 5 and room.nonce == b"n" * 16 and room.endpoints == ("tcp://a:1",)
    assert room.manifest is room.placement is room.assembly is room.deadline is None
    with pytest.raises(TypeError):
        Room(7, np.arange(5), 2, b"k" * 32, 1.0, state=S.ANCHORED)  # a room starts reserved, always


def test_the_next_deadline_is_one_timeout_away_but_never_past_the_cap():
    room = Room(7, np.arange(5), 2, b"k" * 32, 1.0)
    assert room.next_deadline(10.0, 5.0) == 15.0
    room.cap = 12.0
    assert room.next_deadline(10.0, 5.0) == 12.0


def test_the_lifecycle_imports_nothing_from_the_engine():
    code = "import sys, lynx.transfer.room_lifecycle; print('sglang' in sys.modules, 'torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["False", "False"]
