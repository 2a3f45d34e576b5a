"""The receiving side's room state machine, driven by hand with a fake clock."""

import ast
import threading
from pathlib import Path

import numpy as np
import pytest
from lynx.transfer import rooms as rooms_module
from lynx.transfer.room_lifecycle import Owner, RefusedTransition, Room, RoomState, advance
from lynx.transfer.rooms import DuplicateRoom, RoomTable
from races import assert_close_waits_for_the_report


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def wait_until(condition, timeout_s=10.0):
    done = threading.Event()
    for _ in range(int(timeout_s / 0.01)):
        if condition():
            return True
        done.wait(0.01)
    return condition()


def table(timeout=10.0):
    clock = Clock()
    return RoomTable(timeout, clock), clock


def reserve(rooms, room=7, since=100.0, peer="prefill-a"):
    return rooms.reserve(Room(room, np.arange(4), 0, b"k" * 32, since, peer))


def anchored(rooms, room=7):
    reserve(rooms, room)
    assert rooms.start_receiving(room, "manifest", "assembly") is None
    with rooms.writing(room) as allowed:
        assert allowed
    return rooms.get(room)


def test_a_room_walks_from_reserved_to_complete_and_records_its_timings():
    rooms, clock = table()
    reserve(rooms)
    assert rooms.state(7) is RoomState.RESERVED and rooms.get(7).deadline is None
    clock.now = 103.0
    assert rooms.start_receiving(7, "manifest", "assembly") is None
    assert rooms.state(7) is RoomState.RECEIVING and rooms.get(7).deadline == 113.0
    clock.now = 104.0
    with rooms.writing(7) as allowed:
        assert allowed and rooms.state(7) is RoomState.WRITING
    assert rooms.anchored(7) and rooms.state(7) is RoomState.ANCHORED
    clock.now = 106.0
    rooms.all_landed(7, complete=False)
    assert rooms.state(7) is RoomState.LANDED
    assert rooms.take_landed(7).assembly == "assembly"
    assert rooms.take_landed(7) is None and rooms.state(7) is RoomState.COMPLETE
    assert rooms.timings(7) == {
        "manifest_s": 3.0, "transferred_tokens": 4, "anchor_ready_s": 4.0, "residual_ready_s": 6.0,
    }  # fmt: skip


def test_no_deadline_runs_before_the_manifest_however_long_the_prefill_takes():
    rooms, clock = table(timeout=10.0)
    reserve(rooms)
    clock.now += 600
    assert rooms.expire(7) is None and rooms.state(7) is RoomState.RESERVED


def test_every_accepted_frame_pushes_the_deadline_back_and_silence_fails_the_room():
    rooms, clock = table(timeout=10.0)
    anchored(rooms)
    for _ in range(5):
        clock.now += 9
        rooms.progress(7)
        assert rooms.expire(7) is None
    clock.now += 10.5
    reason = rooms.expire(7)
    assert "KV of the request made no progress for 10s" in reason
    assert rooms.state(7) is RoomState.FAILED and rooms.get(7).failure == reason


def test_a_second_live_room_with_the_same_id_is_refused_and_the_first_keeps_its_slots():
    rooms, _ = table()
    first = reserve(rooms)
    with pytest.raises(DuplicateRoom, match="already in use"):
        reserve(rooms)
    assert rooms.get(7) is first
    rooms.fail(7, "gone")
    reserve(rooms)  # an ended room's id may be reused


def test_a_second_manifest_is_ignored_and_changes_nothing():
    rooms, _ = table()
    anchored(rooms)
    problem = rooms.start_receiving(7, "replayed", "other assembly")
    assert "already anchored" in problem
    assert rooms.get(7).manifest == "manifest" and rooms.state(7) is RoomState.ANCHORED


def test_a_failed_or_closing_room_is_never_written():
    rooms, _ = table()
    reserve(rooms)
    rooms.start_receiving(7, "m", "a")
    rooms.fail(7, "bad frame")
    with rooms.writing(7) as allowed:
        assert not allowed
    reserve(rooms, room=8)
    rooms.start_receiving(8, "m", "a")
    rooms.close(8)
    with rooms.writing(8) as allowed:
        assert not allowed
    assert rooms.get(8) is None


def test_close_waits_for_the_write_in_progress_before_it_returns():
    rooms, _ = table()
    reserve(rooms)
    rooms.start_receiving(7, "m", "a")
    inside, release, closed = threading.Event(), threading.Event(), threading.Event()
    order = []

    def writer():
        with rooms.writing(7) as allowed:
            assert allowed
            inside.set()
            release.wait(10)
            order.append("write done")

    def closer():
        rooms.close(7)
        order.append("closed")
        closed.set()

    threads = [threading.Thread(target=writer)]
    threads[0].start()
    assert inside.wait(10)
    threads.append(threading.Thread(target=closer))
    threads[1].start()
    assert not closed.wait(0.2)
    release.set()
    for thread in threads:
        thread.join(10)
    assert order == ["write done", "closed"] and rooms.get(7) is None


def _hold_upgrade(rooms, room=7):
    """A thread inside the room's upgrade fence until the returned event is set."""
    inside, release = threading.Event(), threading.Event()

    def upgrader():
        with rooms.upgrading(room) as entry:
            assert entry is not None
            inside.set()
            release.wait(10)

    thread = threading.Thread(target=upgrader)
    thread.start()
    assert inside.wait(10)
    return release, thread


def test_upgrades_take_turns_keep_the_state_and_close_waits_for_one_in_progress():
    rooms, _ = table()
    anchored(rooms)
    release, first = _hold_upgrade(rooms)
    assert rooms.state(7) is RoomState.ANCHORED, "an upgrade leaves the state alone"
    turns = []

    def second():
        with rooms.upgrading(7) as entry:
            turns.append(entry is not None)

    other = threading.Thread(target=second)
    other.start()
    other.join(0.2)
    assert turns == [], "a second upgrader waits for the first"
    release.set()
    for thread in (first, other):
        thread.join(10)
    assert turns == [True]
    release, first = _hold_upgrade(rooms)
    rooms.fail(7, "lost")  # marks the room; its slots stay reserved until the close
    closed = threading.Event()
    closer = threading.Thread(target=lambda: (rooms.close(7), closed.set()))
    closer.start()
    assert not closed.wait(0.2), "close waits for the upgrade in progress"
    release.set()
    for thread in (first, closer):
        thread.join(10)
    assert closed.is_set() and rooms.get(7) is None


def test_only_a_live_room_past_its_manifest_may_be_upgraded():
    rooms, _ = table()
    reserve(rooms)
    with rooms.upgrading(7) as entry:
        assert entry is None, "reserved: nothing received yet"
    rooms.start_receiving(7, "m", "a")
    with rooms.upgrading(7) as entry:
        assert entry is not None and rooms.state(7) is RoomState.RECEIVING
    rooms.fail(7, "bad frame")
    with rooms.upgrading(7) as entry:
        assert entry is None
    anchored(rooms, room=8)
    rooms.all_landed(8, complete=False)
    with rooms.upgrading(8) as entry:
        assert entry is not None
    assert rooms.take_landed(8) is not None
    with rooms.upgrading(8) as entry:
        assert entry is None, "complete: nothing is left to upgrade"


def test_a_room_closed_during_its_final_write_is_never_anchored():
    rooms, _ = table()
    reserve(rooms)
    rooms.start_receiving(7, "m", "a")
    inside, release = threading.Event(), threading.Event()
    anchored_after = []

    def writer():
        with rooms.writing(7, final=True) as allowed:
            assert allowed
            inside.set()
            release.wait(10)
        anchored_after.append(rooms.anchored(7))

    thread = threading.Thread(target=writer)
    thread.start()
    assert inside.wait(10)
    closer = threading.Thread(target=rooms.close, args=(7,))
    closer.start()
    assert wait_until(lambda: rooms.state(7) is RoomState.CLOSING)
    release.set()
    thread.join(10)
    closer.join(10)
    assert anchored_after == [False] and rooms.get(7) is None


def test_a_failure_during_the_write_wins_over_the_write():
    rooms, _ = table()
    reserve(rooms)
    rooms.start_receiving(7, "m", "a")
    with rooms.writing(7) as allowed:
        assert allowed
        assert rooms.fail(7, "peer lost")
        assert rooms.state(7) is RoomState.WRITING
    assert not rooms.anchored(7) and rooms.state(7) is RoomState.FAILED
    assert rooms.get(7).failure == "peer lost"


def test_release_by_the_transfer_leaves_a_handed_over_room_to_its_consumer():
    rooms, _ = table()
    anchored(rooms)
    rooms.hand_over(7)
    assert rooms.close(7, owner=Owner.TRANSFER) is None and rooms.get(7) is not None
    assert rooms.close(7).state is RoomState.CLOSED and rooms.get(7) is None


def test_rooms_of_a_lost_peer_are_found_by_peer():
    rooms, _ = table()
    reserve(rooms, 1, peer="a")
    reserve(rooms, 2, peer="b")
    reserve(rooms, 3, peer="a")
    rooms.fail(3, "x")
    assert rooms.rooms_of("a") == [1]


def test_one_stream_rooms_complete_when_everything_landed():
    rooms, _ = table()
    anchored(rooms)
    rooms.all_landed(7, complete=True)
    assert rooms.state(7) is RoomState.COMPLETE and rooms.get(7).assembly is None
    assert rooms.take_landed(7) is None


def test_only_a_rooms_own_progress_keeps_it_alive_not_its_senders_other_rooms():
    rooms, clock = table(timeout=10.0)
    for room in (1, 2):
        reserve(rooms, room, peer="a")
        rooms.start_receiving(room, "manifest", "assembly")
    for _ in range(3):
        clock.now += 8
        assert rooms.progress(1)  # room 2 lost a frame: its sender's other room moving does not hide it
    assert rooms.expire(1) is None
    assert "no progress for 10s" in rooms.expire(2)


def test_the_cap_ends_a_room_that_keeps_making_progress_past_it():
    rooms, clock = table(timeout=10.0)
    reserve(rooms)
    assert rooms.start_receiving(7, "manifest", "assembly", cap_s=25.0) is None
    assert rooms.get(7).deadline == 110.0
    for _ in range(2):
        clock.now += 9
        rooms.progress(7)
        assert rooms.expire(7) is None
    assert rooms.get(7).deadline == 125.0, "never past the cap"
    clock.now = 125.5
    rooms.progress(7)
    assert "did not all arrive within 25s" in rooms.expire(7)


def test_an_alive_counter_is_taken_once_and_an_older_one_never():
    rooms, clock = table(timeout=10.0)
    reserve(rooms)
    rooms.start_receiving(7, "manifest", "assembly")
    assert rooms.progress(7, alive=5)
    clock.now += 8
    assert not rooms.progress(7, alive=5) and not rooms.progress(7, alive=4)
    assert rooms.get(7).deadline == 110.0, "a replayed alive pushed the deadline back"
    assert rooms.progress(7, alive=6) and rooms.get(7).deadline == 118.0


def test_a_reserved_room_armed_by_another_part_fails_when_it_stays_silent():
    rooms, clock = table(timeout=10.0)
    reserve(rooms)
    rooms.arm(7)
    assert rooms.get(7).deadline == 110.0 and rooms.state(7) is RoomState.RESERVED
    clock.now += 10.5
    assert "no progress" in rooms.expire(7) and rooms.state(7) is RoomState.FAILED


def test_a_failed_room_keeps_its_assembly_for_an_upgrader_until_it_is_closed():
    rooms, _ = table()
    anchored(rooms)
    with rooms.upgrading(7) as entry:
        rooms.fail(7, "the prefill gave up")  # another thread, inside the upgrader's fence
        assert entry.assembly == "assembly"
    rooms.close(7)
    assert entry.assembly is None


def test_the_anchor_is_reported_only_while_the_room_is_anchored_and_a_close_waits_for_the_report():
    rooms, _ = table()
    reported = []
    reserve(rooms, room=8)
    assert not rooms.if_all_anchored((8,), lambda: reported.append(8))  # still reserved
    anchored(rooms)

    def if_anchored(room, report):
        return rooms.if_all_anchored((room,), lambda: report(room))

    assert_close_waits_for_the_report(if_anchored, 7, lambda: rooms.close(7))
    assert rooms.get(7) is None


S = RoomState


def _walk_to_complete(rooms, clock):
    entry = reserve(rooms)
    rooms.start_receiving(7, "m", "a")
    with rooms.writing(7, final=False):
        pass
    with rooms.writing(7):
        pass
    rooms.all_landed(7, complete=False)
    rooms.take_landed(7)
    rooms.close(7)
    return entry


def _fail_during_a_write(rooms, clock):
    entry = reserve(rooms)
    rooms.start_receiving(7, "m", "a")
    with rooms.writing(7):
        rooms.fail(7, "peer lost")
    rooms.close(7)
    return entry


def _expire_an_armed_reservation(rooms, clock):
    entry = reserve(rooms)
    rooms.arm(7)
    clock.now += 11
    rooms.expire(7)
    rooms.close(7)
    return entry


def _one_stream_then_a_late_failure(rooms, clock):
    entry = anchored(rooms)
    rooms.all_landed(7, complete=True)
    rooms.fail(7, "the prefill reports a failure after all")
    return entry


@pytest.mark.parametrize(
    ("drive", "moves"),
    [
        (_walk_to_complete, [
            (S.RESERVED, S.RECEIVING), (S.RECEIVING, S.WRITING), (S.WRITING, S.RECEIVING),
            (S.RECEIVING, S.WRITING), (S.WRITING, S.ANCHORED), (S.ANCHORED, S.LANDED), (S.LANDED, S.COMPLETE),
            (S.COMPLETE, S.CLOSING), (S.CLOSING, S.CLOSED),
        ]),
        (_fail_during_a_write, [(S.RESERVED, S.RECEIVING), (S.RECEIVING, S.WRITING), (S.WRITING, S.FAILED)]),
        (_expire_an_armed_reservation, [(S.RESERVED, S.FAILED)]),
        (_one_stream_then_a_late_failure, [
            (S.RESERVED, S.RECEIVING), (S.RECEIVING, S.WRITING), (S.WRITING, S.ANCHORED),
            (S.ANCHORED, S.COMPLETE), (S.COMPLETE, S.FAILED),
        ]),
    ],
    ids=lambda value: getattr(value, "__name__", None),
)  # fmt: skip
def test_every_state_change_of_the_table_is_one_checked_move(monkeypatch, drive, moves):
    made = []

    def recorded(current, to):
        made.append((current, to))
        return advance(current, to)

    monkeypatch.setattr(rooms_module, "advance", recorded)
    rooms, clock = table()
    entry = drive(rooms, clock)
    assert made == moves
    assert entry.state is moves[-1][1], "the room ends where its last checked move took it"


def test_a_move_the_table_refuses_raises_and_leaves_the_room_as_it_was():
    rooms, _ = table()
    entry = reserve(rooms)
    with pytest.raises(RefusedTransition, match="from RESERVED to ANCHORED"):
        with rooms._cond:
            rooms._move(entry, S.ANCHORED)
    assert rooms.state(7) is S.RESERVED


def test_only_a_new_room_may_be_reserved():
    rooms, _ = table()
    entry = reserve(rooms)
    rooms.close(7)
    with pytest.raises(ValueError, match="not a new room"):
        rooms.reserve(entry)
    assert rooms.get(7) is None


def test_no_decode_module_sets_a_rooms_state_or_a_requests_hold_but_their_one_move():
    root = Path(rooms_module.__file__).parents[1]
    files = [root / "transfer" / name for name in ("rooms.py", "parts.py", "room_lifecycle.py")]
    files += sorted((root / "pd").glob("decode_*.py"))
    setters = set()
    for path in files:
        for func in ast.walk(ast.parse(path.read_text())):
            if not isinstance(func, ast.FunctionDef):
                continue
            for node in ast.walk(func):
                targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
                for target in targets:
                    for leaf in target.elts if isinstance(target, ast.Tuple) else [target]:
                        if isinstance(leaf, ast.Attribute) and leaf.attr in ("state", "hold"):
                            setters.add((path.name, func.name, leaf.attr))
    assert len(files) >= 7 and setters == {("rooms.py", "_move", "state"), ("parts.py", "_hold", "hold")}
