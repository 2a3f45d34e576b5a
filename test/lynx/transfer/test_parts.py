"""`PartedRooms`: a request received in several parts answers as one."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from lynx.lifecycle import RefusedTransition
from lynx.transfer.parts import HOLD_MOVES, Hold, PartedRooms
from lynx.transfer.room_lifecycle import Room, RoomState
from lynx.transfer.rooms import DuplicateRoom, RoomTable
from races import assert_close_waits_for_the_report


class Clock:
    now = 0.0

    def __call__(self):
        return self.now


def _parts(ids):
    return [Room(wire, np.arange(4), 0, b"k" * 32, 0.0, "prefill") for wire in ids]


@pytest.fixture
def rooms():
    clock = Clock()
    parted = PartedRooms(RoomTable(5.0, clock))
    assert parted.claim(7)
    parted.reserve(7, _parts([7, 70]))
    parted.clock = clock
    return parted


def test_the_request_is_as_far_as_its_least_advanced_part_and_anchored_when_all_are(rooms):
    table = rooms.table
    table.start_receiving(7, object(), object())
    assert rooms.state(7) is RoomState.RESERVED and rooms.request_of(70) == 7
    with table.writing(7):
        pass
    assert not rooms.anchored(7)
    table.start_receiving(70, object(), object())
    with table.writing(70):
        pass
    assert rooms.anchored(7) and rooms.state(7) is RoomState.ANCHORED
    assert rooms.live_requests() == 1


def _anchor(table, wire):
    table.start_receiving(wire, object(), object())
    with table.writing(wire):
        pass


def test_the_request_is_reported_anchored_once_every_part_is_and_a_close_of_a_part_waits_for_the_report(rooms):
    table, reported = rooms.table, []
    _anchor(table, 7)
    assert not rooms.if_anchored(7, reported.append) and reported == []  # part 70 is still reserved
    _anchor(table, 70)
    assert_close_waits_for_the_report(rooms.if_anchored, 7, lambda: table.close(70))  # a part closes
    assert table.get(70) is None


def test_a_part_that_stops_moving_fails_every_part(rooms):
    rooms.table.start_receiving(70, object(), object())
    rooms.clock.now = 6.0
    assert "made no progress" in rooms.expire(7)
    assert [rooms.table.state(w) for w in (7, 70)] == [RoomState.FAILED, RoomState.FAILED]
    assert rooms.state(7) is RoomState.FAILED and not rooms.fail(7, "again")


def test_milestones_are_the_last_parts(rooms):
    table = rooms.table
    for wire, at in ((7, 1.0), (70, 3.0)):
        rooms.clock.now = at
        table.start_receiving(wire, object(), object())
    assert rooms.timings(7)["manifest_s"] == 3.0


def test_the_receivers_release_keeps_handed_over_parts_and_the_request_is_forgotten_when_none_is_left(rooms):
    rooms.hand_over(7)
    assert rooms.release(7) == [] and rooms.parts(7) == (7, 70) and rooms.hold(7) is Hold.CONSUMED
    assert not rooms.claim(7), "the consumer's parts are live"
    assert len(rooms.close(7)) == 2 and rooms.parts(7) == (7,) and rooms.state(7) is None
    assert rooms.hold(7) is Hold.RELEASED and rooms.claim(7)


def test_the_receivers_release_closes_the_parts_it_owns_and_forgets_the_request(rooms):
    assert len(rooms.release(7)) == 2 and rooms.hold(7) is Hold.RELEASED and rooms.table.get(70) is None
    assert rooms.release(7) == [], "a second release is harmless"


def test_a_failed_request_blocks_a_duplicate_claim_until_its_receiver_releases_it(rooms):
    rooms.fail(7, "lost")
    assert rooms.state(7) is RoomState.FAILED and not rooms.claim(7)
    rooms.release(7)
    assert rooms.claim(7) and rooms.hold(7) is Hold.CLAIMED


def test_the_consumers_close_leaves_the_id_held_while_the_receiver_lives(rooms):
    assert len(rooms.close(7)) == 2 and rooms.hold(7) is Hold.RESERVED and not rooms.claim(7)
    rooms.release(7)
    assert rooms.hold(7) is Hold.RELEASED and rooms.claim(7)


def test_a_room_still_being_released_refuses_a_new_claim_until_it_is_closed(rooms):
    rooms.hand_over(7)
    rooms.release(7)
    table = rooms.table
    table.close(70)
    table.start_receiving(7, object(), object())
    with table.writing(7):  # a writer inside: the consumer's close waits in CLOSING
        closer = threading.Thread(target=rooms.close, args=(7,))
        closer.start()
        while table.state(7) is not RoomState.CLOSING:
            time.sleep(0.001)
        assert not rooms.claim(7), "a writer may still be inside the slots"
    closer.join()
    assert rooms.claim(7)


def test_a_claimed_request_with_no_room_yet_is_held_and_a_second_claim_refused():
    parted = PartedRooms(RoomTable(5.0))
    assert parted.claim(3) and not parted.claim(3) and parted.state(3) is None
    parted.release(3)
    assert parted.hold(3) is Hold.RELEASED and parted.claim(3)


def test_a_consumed_request_whose_parts_all_failed_may_be_claimed_again(rooms):
    rooms.hand_over(7)
    rooms.release(7)
    rooms.fail(7, "lost")
    assert rooms.claim(7) and rooms.hold(7) is Hold.CLAIMED
    rooms.reserve(7, _parts([7, 70]))
    assert rooms.state(7) is RoomState.RESERVED


def test_a_receiver_that_ends_before_reserving_leaves_the_consumer_its_earlier_parts(rooms):
    rooms.hand_over(7)
    rooms.release(7)
    rooms.fail(7, "lost")
    assert rooms.claim(7)
    assert rooms.release(7) == [] and rooms.hold(7) is Hold.CONSUMED and rooms.parts(7) == (7, 70)
    assert len(rooms.close(7)) == 2 and rooms.hold(7) is Hold.RELEASED


def test_only_a_claimed_request_reserves():
    parted = PartedRooms(RoomTable(5.0))
    with pytest.raises(RefusedTransition, match="RELEASED to RESERVED"):
        parted.reserve(4, _parts([4]))
    assert parted.table.get(4) is None
    assert parted.claim(4)
    parted.reserve(4, _parts([4]))
    with pytest.raises(RefusedTransition, match="RESERVED to RESERVED"):
        parted.reserve(4, _parts([4]))


def test_the_hold_table_holds_exactly_the_allowed_moves():
    assert {(a, b) for a, to in HOLD_MOVES.items() for b in to} == {
        (Hold.CLAIMED, Hold.RESERVED), (Hold.CLAIMED, Hold.CONSUMED), (Hold.CLAIMED, Hold.RELEASED),
        (Hold.RESERVED, Hold.CONSUMED),
        (Hold.RESERVED, Hold.RELEASED), (Hold.CONSUMED, Hold.CLAIMED), (Hold.CONSUMED, Hold.RELEASED),
    }  # fmt: skip
    assert set(HOLD_MOVES) == set(Hold)


def test_a_part_whose_id_is_taken_reserves_none_of_the_request():
    parted = PartedRooms(RoomTable(5.0))
    assert parted.claim(1) and parted.claim(2)
    parted.reserve(1, _parts([1]))
    with pytest.raises(DuplicateRoom):
        parted.reserve(2, _parts([2, 1]))
    assert parted.table.get(2) is None and parted.parts(2) == (2,) and parted.hold(2) is Hold.CLAIMED


def test_once_one_part_starts_receiving_a_part_that_never_announces_fails_the_request(rooms):
    assert rooms.start_receiving(7, object(), object()) is None
    assert rooms.table.get(70).deadline == 5.0, "the silent part's deadline runs too"
    rooms.clock.now = 5.5
    assert "made no progress" in rooms.expire(7)
    assert rooms.state(7) is RoomState.FAILED
