"""`PrefillRooms` on its own: destinations, segments as chunks are computed, the abort fence."""

import numpy as np

from lynx.pd.control import RoomMetadata
from lynx.pd.prefill_rooms import PrefillRooms

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
