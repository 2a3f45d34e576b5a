"""`PartedRooms`: a request received in several parts answers as one."""

from __future__ import annotations

import numpy as np
import pytest

from lynx.transfer.parts import PartedRooms
from lynx.transfer.room_lifecycle import Owner, Room, RoomState
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


def test_closing_by_owner_keeps_handed_over_parts_and_forgets_the_request_when_none_is_left(rooms):
    rooms.hand_over(7)
    assert rooms.close(7, owner=Owner.TRANSFER) == [] and rooms.parts(7) == (7, 70)
    assert len(rooms.close(7)) == 2 and rooms.parts(7) == (7,) and rooms.state(7) is None


def test_a_part_whose_id_is_taken_reserves_none_of_the_request():
    parted = PartedRooms(RoomTable(5.0))
    parted.reserve(1, _parts([1]))
    with pytest.raises(DuplicateRoom):
        parted.reserve(2, _parts([2, 1]))
    assert parted.table.get(2) is None and parted.parts(2) == (2,)


def test_once_one_part_starts_receiving_a_part_that_never_announces_fails_the_request(rooms):
    assert rooms.start_receiving(7, object(), object()) is None
    assert rooms.table.get(70).deadline == 5.0, "the silent part's deadline runs too"
    rooms.clock.now = 5.5
    assert "made no progress" in rooms.expire(7)
    assert rooms.state(7) is RoomState.FAILED
