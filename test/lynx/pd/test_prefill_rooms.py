"""`PrefillRooms` on its own: destinations, segments as chunks are computed, the abort fence, and each
room's lifecycle as the table applies it."""

import numpy as np
import pytest

from lynx.pd.control import RoomMetadata
from lynx.pd.prefill_lifecycle import PrefillRoomState, RefusedTransition
from lynx.pd.prefill_rooms import STALE_METADATA_S, PrefillRooms

NONCE = bytes(16)


def metadata(room=9, session="s1", ranks=1, dummy=False, prefix=0, tokens=10):
    return RoomMetadata(room, "127.0.0.1", 5000, session, ranks, dummy, prefix, tokens, NONCE, "tcp://127.0.0.1:6000")


def rooms_of(per_segment=4):
    return PrefillRooms(lambda total: [(s, min(per_segment, total - s)) for s in range(0, total, per_segment)])


def test_a_room_is_ready_once_every_decode_rank_sent_its_metadata():
    rooms = rooms_of()
    assert rooms.add_metadata(metadata(session="s1", ranks=2, prefix=3)) is None
    assert rooms.add_metadata(metadata(session="s2", ranks=2, dummy=True)) == 3


def test_segments_are_handed_out_as_their_tokens_are_computed():
    rooms = rooms_of()
    rooms.add_metadata(metadata(tokens=10))
    segments, problem = rooms.add_chunk(9, np.arange(3), 2, 6, is_last=False)
    assert problem is None and [(s.index, s.first_token, s.total) for s in segments] == [(0, 0, 10)]
    assert segments[0].slots.tolist() == [0, 1, 2, 3]
    segments, problem = rooms.add_chunk(9, np.arange(3, 5), 2, 4, is_last=True)
    assert problem is None and [(s.index, s.first_token) for s in segments] == [(1, 4), (2, 8)]
    assert segments[1].slots.tolist() == [8, 9]


def test_a_token_count_other_than_the_reservation_is_a_problem():
    rooms = rooms_of()
    rooms.add_metadata(metadata(tokens=10))
    segments, problem = rooms.add_chunk(9, np.arange(4), 2, 8, is_last=True)
    assert segments == [] and "reserved 10 tokens, this prefill has 8" in problem


def test_an_aborted_room_is_neither_planned_nor_encoded():
    rooms = rooms_of()
    rooms.add_metadata(metadata())
    assert rooms.claim(9)
    rooms.abort(9)
    assert rooms.add_chunk(9, np.arange(5), 2, 10, is_last=True) is None
    assert rooms.start_encoding(9, failed=lambda room: False) == [] and not rooms.busy(9)


def test_an_abort_during_encoding_is_reported_when_it_ends():
    rooms = rooms_of()
    rooms.add_metadata(metadata())
    assert rooms.claim(9)
    assert rooms.start_encoding(9, failed=lambda room: False) and rooms.busy(9)
    rooms.abort(9)
    assert rooms.busy(9) and rooms.end_encoding(9) and not rooms.busy(9)
    assert rooms.not_aborted([9, 10]) == {10}


def test_abort_notices_for_rooms_never_claimed_here_leave_nothing_behind():
    rooms = rooms_of()
    for room in range(1000, 2000):
        rooms.abort(room)
    assert rooms.state_counts()["aborted"] == 0
    assert rooms.claim(9)
    rooms.abort(9)
    assert rooms.state_counts()["aborted"] == 1
    rooms.release(9)
    assert rooms.state_counts() == {"encoding": 0, "claimed": 0, "aborted": 0, "metadata": 0}


# --- the lifecycle as PrefillRooms applies it ----------------------------------------------------

S = PrefillRoomState


def not_failed(room):
    return False


class Clock:
    now = 100.0

    def __call__(self):
        return self.now


def claimed_room(state=S.CLAIMED):
    """Room 9 with one real destination, claimed and brought to `state` the way the encoder does."""
    rooms = rooms_of()
    rooms.add_metadata(metadata())
    assert rooms.claim(9)
    steps = {
        S.CLAIMED: [],
        S.ENCODING: ["start"],
        S.ANNOUNCED: ["start", "end", "announce"],
        S.ANNOUNCED_ENCODING: ["start", "end", "announce", "start"],
        S.ABORTED: ["abort"],
        S.ABORTED_ENCODING: ["start", "abort"],
    }[state]
    for step in steps:
        if step == "start":
            assert rooms.start_encoding(9, not_failed)
        elif step == "end":
            rooms.end_encoding(9)
        elif step == "announce":
            rooms.announce(9, "tcp://127.0.0.1:6000", b"k", 90)
        else:
            rooms.abort(9)
    assert rooms.state(9) is state
    return rooms


def test_a_room_is_unclaimed_until_its_sender_claims_it_and_a_second_claim_is_refused():
    rooms = rooms_of()
    rooms.add_metadata(metadata())
    assert rooms.state(9) is S.UNCLAIMED and rooms.claimed_count() == 0
    assert rooms.claim(9) and rooms.state(9) is S.CLAIMED
    assert not rooms.claim(9) and rooms.claimed_count() == 1


def test_a_room_no_sender_claims_is_never_encoded():
    rooms = rooms_of()
    rooms.add_metadata(metadata())
    assert rooms.start_encoding(9, not_failed) == [] and not rooms.busy(9)
    assert rooms.state(9) is S.UNCLAIMED


def test_a_failed_room_or_one_without_a_real_destination_is_not_encoded():
    rooms = claimed_room()
    assert rooms.start_encoding(9, failed=lambda room: room == 9) == [] and rooms.state(9) is S.CLAIMED
    assert rooms.claim(5) and rooms.start_encoding(5, not_failed) == [] and rooms.state(5) is S.CLAIMED


def test_the_first_segment_is_encoded_then_announced_and_its_decode_ranks_hear_it_is_alive_until_quiet():
    rooms = claimed_room(S.ENCODING)
    assert rooms.busy(9) and rooms.announced() == []
    assert rooms.end_encoding(9) is False and rooms.state(9) is S.CLAIMED and not rooms.busy(9)
    rooms.announce(9, "tcp://127.0.0.1:6000", b"k", 90)
    rooms.announce(9, "tcp://127.0.0.1:6001", b"k", 91)
    assert rooms.state(9) is S.ANNOUNCED
    assert rooms.announced() == [(9, [("tcp://127.0.0.1:6000", b"k", 90, 0), ("tcp://127.0.0.1:6001", b"k", 91, 0)])]
    rooms.quiet(9)
    assert rooms.state(9) is S.CLAIMED and rooms.announced() == []
    assert rooms.wires(9) == {9, 90, 91} and rooms.room_of(91) == 9 and rooms.room_of(92) == 92


def test_an_announced_room_stays_alive_while_a_later_segment_is_encoded():
    rooms = claimed_room(S.ANNOUNCED_ENCODING)
    assert rooms.busy(9) and [room for room, _ in rooms.announced()] == [9]
    assert rooms.end_encoding(9) is False and rooms.state(9) is S.ANNOUNCED


def test_a_send_error_while_a_segment_is_encoded_quiets_the_room_and_the_encoding_goes_on():
    rooms = claimed_room(S.ANNOUNCED_ENCODING)
    rooms.quiet(9)
    assert rooms.state(9) is S.ENCODING and rooms.busy(9) and rooms.announced() == []
    assert rooms.end_encoding(9) is False and rooms.state(9) is S.CLAIMED


@pytest.mark.parametrize("state", [S.CLAIMED, S.ENCODING, S.ANNOUNCED, S.ANNOUNCED_ENCODING], ids=str)
def test_an_abort_in_any_claimed_state_stops_everything_but_a_read_in_progress(state):
    rooms = claimed_room(state)
    rooms.abort(9)
    assert rooms.state(9) is (S.ABORTED_ENCODING if state.encoding else S.ABORTED)
    assert rooms.busy(9) is state.encoding and rooms.announced() == [] and rooms.not_aborted([9]) == set()
    assert rooms.add_chunk(9, np.arange(5), 2, 10, is_last=True) is None and rooms.begin_forward(9, np.arange(10)) == []
    assert rooms.end_encoding(9) is True and rooms.state(9) is S.ABORTED and not rooms.busy(9)
    assert rooms.start_encoding(9, not_failed) == [] and not rooms.claim(9)


def test_a_second_abort_and_a_quiet_of_an_aborted_room_change_nothing():
    rooms = claimed_room(S.ABORTED)
    rooms.abort(9)
    rooms.quiet(9)
    assert rooms.state(9) is S.ABORTED


def test_a_part_announced_after_an_abort_is_remembered_for_cancelling_but_never_announced_alive():
    rooms = claimed_room(S.ABORTED)
    rooms.announce(9, "tcp://127.0.0.1:6000", b"k", 90)
    assert rooms.state(9) is S.ABORTED and rooms.announced() == [] and rooms.wires(9) == {9, 90}


def test_encoding_a_room_the_encoder_already_reads_is_refused_loudly():
    rooms = claimed_room(S.ENCODING)
    with pytest.raises(RefusedTransition, match="ENCODING refuses START_ENCODING"):
        rooms.start_encoding(9, not_failed)
    assert rooms.state(9) is S.ENCODING


@pytest.mark.parametrize("state", [S.CLAIMED, S.ENCODING, S.ANNOUNCED, S.ANNOUNCED_ENCODING, S.ABORTED], ids=str)
def test_the_release_forgets_the_room_whatever_its_state(state):
    rooms = claimed_room(state)
    rooms.release(9)
    assert rooms.state(9) is None and not rooms.busy(9) and rooms.announced() == [] and rooms.wires(9) == {9}
    assert rooms.end_encoding(9) is False and rooms.state(9) is None
    assert rooms.state_counts() == {"encoding": 0, "claimed": 0, "aborted": 0, "metadata": 0}


def test_an_announcement_of_a_released_room_leaves_nothing_alive():
    rooms = claimed_room(S.ENCODING)
    rooms.release(9)
    rooms.announce(9, "tcp://127.0.0.1:6000", b"k", 90)
    assert rooms.state(9) is None and rooms.announced() == [] and rooms.room_of(90) == 90


def test_only_rooms_left_unclaimed_are_purged_once_their_metadata_is_stale():
    clock = Clock()
    rooms = PrefillRooms(lambda total: [(0, total)], clock)
    for room in (1, 2):
        rooms.add_metadata(metadata(room=room))
    assert rooms.claim(2)
    clock.now += STALE_METADATA_S
    assert rooms.purge() == 0
    clock.now += 1
    assert rooms.purge() == 1 and rooms.state(1) is None and rooms.state(2) is S.CLAIMED


def test_the_state_counts_follow_the_states():
    rooms = claimed_room(S.ABORTED_ENCODING)
    assert rooms.claim(3)
    rooms.add_metadata(metadata(room=4))
    assert rooms.state_counts() == {"encoding": 1, "claimed": 2, "aborted": 1, "metadata": 2}
