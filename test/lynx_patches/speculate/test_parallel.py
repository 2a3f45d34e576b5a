"""Distinct transfer rooms for the parts of a parallel-sampling request, alike on both servers."""

from __future__ import annotations

from types import SimpleNamespace

from lynx_patches.speculate.parallel import SampleRooms, sample_room, send_one_request


def test_the_prefix_request_keeps_the_room_and_every_sample_gets_its_own():
    rooms = SampleRooms()
    parts = [rooms.assign(77, n=3) for _ in range(4)]
    assert parts[0] == 77 and len(set(parts)) == 4
    assert parts == [sample_room(77, k) for k in range(4)]


def test_two_servers_numbering_the_same_parts_agree_and_a_later_request_starts_over():
    prefill, decode = SampleRooms(), SampleRooms()
    assert [prefill.assign(5, 2) for _ in range(3)] == [decode.assign(5, 2) for _ in range(3)]
    assert prefill.assign(5, 2) == 5, "after n + 1 parts the room is forgotten"


def test_interleaved_requests_are_counted_per_room():
    rooms = SampleRooms()
    a0, b0, a1, b1 = rooms.assign(1, 2), rooms.assign(2, 2), rooms.assign(1, 2), rooms.assign(2, 2)
    assert (a0, b0) == (1, 2) and a1 == sample_room(1, 1) and b1 == sample_room(2, 1)


def _tokenized(room, n):
    return SimpleNamespace(bootstrap_room=room, sampling_params=SimpleNamespace(n=n))


def test_the_hook_rewrites_rooms_only_for_parallel_sampling_on_a_lynx_server():
    lynx = SimpleNamespace(server_args=SimpleNamespace(_lynx=object()))
    single = _tokenized(9, 1)
    send_one_request(lynx, single)
    assert single.bootstrap_room == 9
    parts = [_tokenized(9, 2) for _ in range(3)]
    for part in parts:
        send_one_request(lynx, part)
    assert [p.bootstrap_room for p in parts] == [sample_room(9, k) for k in range(3)]
    plain = SimpleNamespace(server_args=SimpleNamespace())
    other = _tokenized(9, 2)
    send_one_request(plain, other)
    assert other.bootstrap_room == 9
