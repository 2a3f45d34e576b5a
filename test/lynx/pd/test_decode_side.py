"""`DecodeSide` against a fake pool and host: the room lifecycle, its fence, and hostile or broken input.

Messages are fed to the side's message handler the way its data thread would
(`_on_message`), except in the tests of the socket itself.
"""

from __future__ import annotations

import contextlib
import threading

import numpy as np
import pytest
import torch
from lynx.transfer.keys import curve_keys, transfer_key
from lynx.transfer.rooms import RoomState
from lynx.transfer.transport import TransportError
from lynx.transfer.zmq_transport import ZmqTransport
from pd_fakes import SECRET, DecodeHost, FakePool, config, transfer_messages, wait_for

from lynx.pd.decode_side import DecodeSide

ROOM = 4242
SRC, DST = list(range(10, 30)), list(range(40, 60))
AUX = bytes(range(24))


class Clock:
    now = 1000.0

    def __call__(self):
        return self.now


@pytest.fixture
def clock():
    return Clock()


def make_side(clock, **options):
    host = DecodeHost()
    side = DecodeSide(config(**options), SECRET, host, "127.0.0.1", clock=clock)
    target = FakePool(seed=1)
    side.attach(target.view)
    return side, host, target


@pytest.fixture
def lynx_side(clock):
    side, host, target = make_side(clock)
    yield side, host, target
    side.close()


def reserve(side, room=ROOM, slots=DST, aux_index=1):
    assert side.claim(room)
    nonce = side.reserve(room, np.array(slots), aux_index, 1000.0, "prefill-a", ("tcp://127.0.0.1:9",))
    return transfer_key(SECRET, nonce)


def messages(side, key, room=ROOM, src=SRC, **options):
    cfg = config(**options) if options else side.config
    manifest, frames = transfer_messages(cfg, FakePool(seed=0), src, room, key, AUX)
    return manifest, frames


def deliver(side, parts_list):
    for parts in parts_list:
        side._on_message(parts)


def expected_kv(side, streams_used):
    source = FakePool(seed=0)
    target = FakePool(seed=1)
    wire = side.wire
    index = torch.tensor(SRC)
    streams = wire.encode(source.k, source.v, index)
    wire.write(streams[:streams_used], source.view.shape(len(SRC)), target.k, target.v, torch.tensor(DST))
    return target.snapshot(DST)


def test_anchor_lands_in_the_slots_then_the_residual_waits_for_the_scheduler(lynx_side):
    side, host, target = lynx_side
    key = reserve(side)
    manifest, frames = messages(side, key)
    deliver(side, [manifest.seal(key)])
    assert side.room_state(ROOM) is RoomState.RECEIVING and host.moving == [ROOM]
    deliver(side, frames[255] + frames[0])
    assert host.succeeded == [ROOM] and side.room_state(ROOM) is RoomState.ANCHORED
    assert all(torch.equal(a, b) for a, b in zip(target.snapshot(DST), expected_kv(side, 1)))
    assert bytes(np.concatenate(target.aux_rows, axis=1)[1]) == AUX
    deliver(side, frames[1])
    assert side.landed.is_set() and side.room_state(ROOM) is RoomState.LANDED
    assert side.apply_residual(ROOM) and side.room_state(ROOM) is RoomState.COMPLETE
    assert all(torch.equal(a, b) for a, b in zip(target.snapshot(DST), expected_kv(side, 2)))
    assert side.apply_residual(ROOM), "a complete room stays complete while other decode ranks catch up"


def test_one_stream_mode_is_complete_at_the_anchor_and_released_by_the_receiver(clock):
    side, host, target = make_side(clock, mode="int8")
    try:
        key = reserve(side)
        manifest, frames = messages(side, key)
        deliver(side, [manifest.seal(key)] + frames[255] + frames[0])
        assert host.succeeded == [ROOM] and side.room_state(ROOM) is RoomState.COMPLETE
        assert all(torch.equal(a, b) for a, b in zip(target.snapshot(DST), expected_kv(side, 1)))
        side.release(ROOM)
        assert side.room_state(ROOM) is None and side.claim(ROOM)
    finally:
        side.close()


def test_a_replayed_manifest_after_the_residual_landed_changes_nothing(lynx_side):
    side, host, _ = lynx_side
    key = reserve(side)
    manifest, frames = messages(side, key)
    deliver(side, [manifest.seal(key)] + frames[255] + frames[0] + frames[1])
    deliver(side, [manifest.seal(key)])
    assert side.room_state(ROOM) is RoomState.LANDED and side.dropped == 1
    assert side.apply_residual(ROOM) and host.failures == []


def test_a_manifest_for_fewer_tokens_than_reserved_fails_the_room(lynx_side):
    side, host, _ = lynx_side
    key = reserve(side)
    manifest, _ = messages(side, key, src=SRC[:-1])
    deliver(side, [manifest.seal(key)])
    assert host.failures == [(ROOM, "19 tokens announced, 20 slots reserved")]
    assert side.room_state(ROOM) is RoomState.FAILED


def test_a_second_live_request_with_the_same_room_cannot_claim_it(lynx_side):
    side, _, _ = lynx_side
    reserve(side)
    assert not side.claim(ROOM)


def test_slots_released_before_the_anchor_arrives_are_never_written(lynx_side):
    side, host, target = lynx_side
    key = reserve(side)
    manifest, frames = messages(side, key)
    deliver(side, [manifest.seal(key)])
    side.release(ROOM)  # client abort: SGLang frees the slots and reuses them at once
    before = target.snapshot(DST)
    deliver(side, frames[255] + frames[0])
    assert all(torch.equal(a, b) for a, b in zip(target.snapshot(DST), before))
    assert host.succeeded == [] and side.dropped == len(frames[255]) + len(frames[0])


def release_during_a_slow_write(side, monkeypatch, writer_of, name, frames_before, frames_during):
    """Deliver `frames_during` on a writer thread while `writer_of.name` (a wire or pool write) is
    held up, and release the room meanwhile; whether the release waited for the write to end."""
    deliver(side, frames_before)
    writing, finish = threading.Event(), threading.Event()
    write = getattr(writer_of, name)

    def slow_write(*args):
        writing.set()
        finish.wait(10)
        write(*args)

    monkeypatch.setattr(type(writer_of), name, lambda self, *args: slow_write(*args))
    writer = threading.Thread(target=deliver, args=(side, frames_during))
    writer.start()
    assert writing.wait(10)
    released = threading.Event()
    releaser = threading.Thread(target=lambda: (side.release(ROOM), released.set()))
    releaser.start()
    waited = not released.wait(0.3)
    finish.set()
    writer.join(10)
    releaser.join(10)
    return waited and released.is_set()


def test_a_release_during_the_anchor_write_waits_for_it_and_success_is_not_reported(lynx_side, monkeypatch):
    side, host, _ = lynx_side
    key = reserve(side)
    manifest, frames = messages(side, key)
    before, during = [manifest.seal(key)] + frames[255], frames[0]
    waited = release_during_a_slow_write(side, monkeypatch, side.wire, "write", before, during)
    assert waited, "release returned while the anchor was being written"
    assert side.room_state(ROOM) is None and host.succeeded == []


def test_a_release_during_the_metadata_write_waits_for_it_and_success_is_not_reported(lynx_side, monkeypatch):
    side, host, _ = lynx_side
    key = reserve(side)
    manifest, frames = messages(side, key)
    before, during = [manifest.seal(key)] + frames[0], frames[255]
    waited = release_during_a_slow_write(side, monkeypatch, side.pool, "write_aux", before, during)
    assert waited, "release returned while the request metadata was being written"
    assert side.room_state(ROOM) is None and host.succeeded == []


def test_a_release_right_after_the_anchor_is_in_is_never_followed_by_success(lynx_side, monkeypatch):
    """The consumer releases the room the moment its anchor is in: success is reported before
    the release returns, or not at all, never after it (a later request may reuse the room id)."""
    side, host, _ = lynx_side
    key = reserve(side)
    manifest, frames = messages(side, key)
    table = type(side._rooms)
    anchored = table.anchored

    def anchored_then_released(self, room):
        result = anchored(self, room)
        if result and side.room_state(room) is not None:
            side.release(room)
            host.succeeded.append("released")
        return result

    monkeypatch.setattr(table, "anchored", anchored_then_released)
    deliver(side, [manifest.seal(key)] + frames[0] + frames[255])
    assert side.room_state(ROOM) is None and "released" in host.succeeded
    assert host.succeeded[-1] == "released", f"success reported after the release: {host.succeeded}"


class RecordingPool:
    """A pool view that logs its metadata writes and each `synchronize` with the room's state then."""

    def __init__(self, view, log, side):
        self._view, self._log, self._side = view, log, side

    def __getattr__(self, name):
        return getattr(self._view, name)

    def write_aux(self, index, data):
        self._log.append("metadata written")
        self._view.write_aux(index, data)

    def synchronize(self):
        self._log.append(("synchronized", self._side.room_state(ROOM)))


def test_each_write_is_synchronized_inside_the_fence_before_success_is_reported(lynx_side, monkeypatch):
    side, host, target = lynx_side
    log = []
    side.attach(RecordingPool(target.view, log, side))
    write = side.wire.write
    monkeypatch.setattr(type(side.wire), "write", lambda wire, *args: (log.append("anchor written"), write(*args)))
    monkeypatch.setattr(host, "succeed", lambda room: log.append("success reported"))
    key = reserve(side)
    manifest, frames = messages(side, key)
    deliver(side, [manifest.seal(key)] + frames[0] + frames[255])
    fenced = ("synchronized", RoomState.WRITING)
    assert log == ["anchor written", fenced, "metadata written", fenced, "success reported"]


def test_frames_signed_with_another_key_are_dropped_without_failing_the_room(lynx_side):
    side, host, _ = lynx_side
    key = reserve(side)
    manifest, frames = messages(side, key)
    _, forged = messages(side, b"x" * 32)
    deliver(side, [manifest.seal(key)] + forged[0][:1])
    assert host.failures == [] and side.dropped == 1 and side.room_state(ROOM) is RoomState.RECEIVING
    deliver(side, frames[255] + frames[0])
    assert host.succeeded == [ROOM]


def junk_variants(parts):
    """Unauthenticated copies of a frame: another version, a payload longer than its header
    says, and a header declaring more than a chunk, each with the original (now wrong) MAC."""
    head, payload = parts
    other_version = bytearray(head)
    other_version[4] = 99
    oversized = bytearray(head)
    oversized[30:34] = (1 << 20).to_bytes(4, "big")
    return [[bytes(other_version), payload], [head, payload + b"x"], [bytes(oversized), b"x" * (1 << 20)]]


def test_junk_frames_naming_a_receiving_room_are_dropped_and_do_not_fail_it(lynx_side):
    side, host, _ = lynx_side
    key = reserve(side)
    manifest, frames = messages(side, key)
    deliver(side, [manifest.seal(key)])
    deliver(side, junk_variants(frames[0][0]))
    assert host.failures == [] and side.dropped == 3 and side.room_state(ROOM) is RoomState.RECEIVING
    deliver(side, frames[255] + frames[0])
    assert host.succeeded == [ROOM]


def test_a_junk_manifest_too_large_to_be_one_is_dropped_and_does_not_fail_the_room(lynx_side):
    side, host, _ = lynx_side
    key = reserve(side)
    tag, room, body, mac = messages(side, key)[0].seal(key)
    deliver(side, [[tag, room, body + b" " * 8192, mac]])
    assert host.failures == [] and side.dropped == 1 and side.room_state(ROOM) is RoomState.RESERVED


def test_junk_is_rejected_without_computing_a_single_mac(lynx_side, monkeypatch):
    from lynx.transfer import frames as frame_module

    side, host, _ = lynx_side
    key = reserve(side)
    manifest, frames = messages(side, key)
    deliver(side, [manifest.seal(key)])
    ended_key = reserve(side, room=7, slots=range(0, 20))
    _, ended = messages(side, ended_key, room=7)
    side.on_prefill_failure(7, "the prefill gave up")
    _, unknown = messages(side, key, room=999)
    macs = []
    real_mac = frame_module._frame_mac
    monkeypatch.setattr(frame_module, "_frame_mac", lambda *args: macs.append(1) or real_mac(*args))
    junk = [unknown[0][0], ended[0][0], *junk_variants(frames[0][0])]
    deliver(side, junk)
    assert macs == [] and side.dropped == len(junk)
    assert host.failures == [(7, "the prefill gave up")] and side.room_state(ROOM) is RoomState.RECEIVING


def test_a_manifest_recorded_from_another_transfer_does_not_verify(lynx_side):
    side, host, _ = lynx_side
    old_key = reserve(side)
    manifest, _ = messages(side, old_key)
    side.release(ROOM)
    reserve(side)  # the same room id, a new transfer with a new nonce
    deliver(side, [manifest.seal(old_key)])
    assert side.room_state(ROOM) is RoomState.RESERVED and side.dropped == 1 and host.failures == []


def test_a_signed_manifest_with_wrongly_typed_fields_fails_the_room_at_once(lynx_side):
    side, host, _ = lynx_side
    key = reserve(side)
    manifest, _ = messages(side, key)
    parts = manifest.seal(key)
    body = parts[2].replace(b'"num_tokens": 20', b'"num_tokens": "20"')
    from lynx.transfer.frames import sign

    deliver(side, [[parts[0], parts[1], body, sign(key, parts[0], parts[1], body)]])
    assert len(host.failures) == 1 and "num_tokens" in host.failures[0][1]


def test_the_deadline_waits_for_the_announcement_then_counts_silence(lynx_side, clock):
    side, host, _ = lynx_side
    key = reserve(side)
    clock.now += 3600  # a prefill queued or computing for an hour
    assert side.check(ROOM) is None
    manifest, frames = messages(side, key)
    deliver(side, [manifest.seal(key)] + frames[255][:1])
    clock.now += 29
    deliver(side, frames[255][1:] + frames[0][:1])
    clock.now += 29
    assert side.check(ROOM) is None
    clock.now += 2
    assert "no progress for 30s" in side.check(ROOM)


def test_a_lost_prefill_fails_its_rooms_but_not_completed_ones(lynx_side):
    side, host, _ = lynx_side
    key = reserve(side)
    reserve(side, room=7, slots=range(0, 20))
    manifest, frames = messages(side, key)
    deliver(side, [manifest.seal(key)] + frames[255] + frames[0] + frames[1])
    side.apply_residual(ROOM)
    side.fail_peer("prefill-a", "lost connection")
    assert host.failures == [(7, "lost connection")]
    assert side.room_state(ROOM) is RoomState.COMPLETE


def test_a_data_thread_crash_outside_any_room_fails_every_live_room_and_the_thread_restarts(lynx_side, monkeypatch):
    side, host, _ = lynx_side
    reserve(side)
    reserve(side, room=7, slots=range(0, 20))
    calls = []
    recv = side.listener.recv

    def broken_recv(timeout_s):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("boom")
        return recv(0.01)

    monkeypatch.setattr(side.listener, "recv", broken_recv)
    side.start()
    assert wait_for(lambda: len(calls) > 2), "the data thread was not restarted"
    assert sorted(room for room, _ in host.failures) == [7, ROOM]
    assert all("Lynx data thread failed (RuntimeError: boom)" in reason for _, reason in host.failures)
    assert side.supervisor.broken is None


def test_a_data_thread_crash_on_a_rooms_message_fails_only_that_room(lynx_side, monkeypatch):
    side, host, _ = lynx_side
    key = reserve(side)
    other_key = reserve(side, room=7, slots=range(0, 20))
    manifest, frames = messages(side, key)
    other_manifest, _ = messages(side, other_key, room=7)
    deliver(side, [manifest.seal(key), other_manifest.seal(other_key)] + frames[255])
    script = iter(frames[0])  # the anchor: its last chunk makes the data thread write it
    monkeypatch.setattr(side.listener, "recv", lambda timeout_s: next(script, None) or threading.Event().wait(0.01))

    def broken_write(*args):
        raise RuntimeError("write bug")

    monkeypatch.setattr(type(side.wire), "write", lambda wire, *args: broken_write(*args))
    side.start()
    assert wait_for(lambda: host.failures), "the crash was not reported"
    assert host.failures == [(ROOM, "Lynx data thread failed (RuntimeError: write bug); the room's frames may be lost")]
    assert side.room_state(7) is RoomState.RECEIVING and side.supervisor.restarts == 1


def test_a_peer_without_the_secret_cannot_get_a_byte_to_the_data_thread(lynx_side):
    side, host, _ = lynx_side
    side.start()
    with ZmqTransport(send_timeout_s=0.5) as plain, ZmqTransport(send_timeout_s=0.5, curve=curve_keys(b"y" * 32)) as wrong:
        for transport in (plain, wrong):
            with pytest.raises(TransportError):
                transport.send(side.data_endpoint, [b"junk"] * 6000)
    with ZmqTransport(send_timeout_s=5, curve=curve_keys(SECRET)) as good:
        good.send(side.data_endpoint, [b"junk"])
    assert wait_for(lambda: side.dropped == 1) and host.failures == []


def test_the_prefill_still_computing_keeps_a_room_alive_and_a_forged_alive_does_not(lynx_side, clock):
    from lynx.transfer.alive import encode_alive

    side, host, _ = lynx_side
    key = reserve(side)
    manifest, _ = messages(side, key)
    deliver(side, [manifest.seal(key)])
    for counter in range(4):
        clock.now += 20
        deliver(side, [encode_alive(ROOM, counter, key)])
    assert side.check(ROOM) is None
    clock.now += 20
    deliver(side, [encode_alive(ROOM, 99, b"z" * 32)])
    clock.now += 11
    assert "no progress" in side.check(ROOM) and side.dropped == 1


def test_a_signed_manifest_of_deeply_nested_json_fails_the_room_and_the_data_thread_lives(lynx_side):
    from lynx.manifest import MANIFEST_TAG
    from lynx.transfer.frames import seal

    side, host, _ = lynx_side
    key = reserve(side)
    other_key = reserve(side, room=7, slots=range(0, 20))
    body = b"[" * 2000 + b"]" * 2000
    deliver(side, [seal(key, [MANIFEST_TAG, ROOM.to_bytes(8, "big"), body])])  # raises nothing
    assert len(host.failures) == 1 and host.failures[0][0] == ROOM and "nested" in host.failures[0][1]
    manifest, frames = messages(side, other_key, room=7)
    deliver(side, [manifest.seal(other_key)] + frames[255] + frames[0])
    assert host.succeeded == [7]


def test_a_room_missing_a_frame_fails_in_time_while_its_prefills_other_room_keeps_moving(lynx_side, clock):
    side, host, _ = lynx_side
    key = reserve(side)
    other_key = reserve(side, room=7, slots=range(0, 20))  # the same prefill sends both
    manifest, frames = messages(side, key)
    other_manifest, other_frames = messages(side, other_key, room=7)
    deliver(side, [manifest.seal(key)] + frames[255] + frames[0][:-1])  # the anchor's last frame is lost
    deliver(side, [other_manifest.seal(other_key)])
    moving = other_frames[255] + other_frames[0] + other_frames[1]
    assert len(moving) * 20 > 2 * 30
    for frame in moving:
        clock.now += 20
        deliver(side, [frame])
    assert side.check(7) is None and host.succeeded == [7]
    assert "no progress for 30s" in (side.check(ROOM) or "no failure")


def test_alive_messages_keep_a_room_waiting_only_up_to_its_cap(lynx_side, clock):
    from lynx.transfer.alive import encode_alive

    side, host, _ = lynx_side
    key = reserve(side)
    manifest, _ = messages(side, key)
    deliver(side, [manifest.seal(key)])
    cap = clock.now + 30 * (manifest.frame_count(side.wire, side.config.chunk_bytes) + 1)
    counter = 0
    while clock.now + 20 < cap:
        clock.now += 20
        counter += 1
        deliver(side, [encode_alive(ROOM, counter, key)])
        assert side.check(ROOM) is None
    clock.now = cap + 1
    deliver(side, [encode_alive(ROOM, counter + 1, key)])
    assert "did not all arrive within" in side.check(ROOM)


def test_a_captured_alive_message_replayed_does_not_keep_the_room_alive(lynx_side, clock, monkeypatch):
    from pd_fakes import recording_prefill_side

    from lynx.pd import prefill_side as prefill_module

    side, host, _ = lynx_side
    key = reserve(side)
    manifest, _ = messages(side, key)
    deliver(side, [manifest.seal(key)])
    prefill = recording_prefill_side()
    monkeypatch.setattr(prefill_module, "ALIVE_EVERY_S", 0.01)
    assert prefill.claim(ROOM)
    prefill._rooms.announce(ROOM, side.data_endpoint, key, ROOM)
    prefill.start()
    try:
        assert wait_for(lambda: prefill.transport.sent)
    finally:
        prefill.close()
    captured = prefill.transport.sent[0][1]
    deliver(side, [captured])
    for _ in range(3):
        clock.now += 20
        deliver(side, [captured])
    assert "no progress for 30s" in (side.check(ROOM) or "no failure") and side.dropped == 3


def test_a_part_that_never_announces_fails_the_request_once_another_part_started(lynx_side, clock):
    side, host, _ = lynx_side
    assert side.claim(ROOM)
    nonce = side.reserve(ROOM, np.array(DST), 1, 1000.0, "prefill-a", (), sources=2)
    key = transfer_key(SECRET, nonce)
    manifest, frames = messages(side, key)
    deliver(side, [manifest.seal(key)] + frames[255] + frames[0] + frames[1])
    assert side.room_state(ROOM) is RoomState.RESERVED, "part 1 never announced"
    clock.now += 3600
    assert "no progress" in (side.check(ROOM) or "no failure")
    assert side.room_state(ROOM) is RoomState.FAILED


def landed(side, room=ROOM, slots=DST):
    key = reserve(side, room=room, slots=slots)
    manifest, frames = messages(side, key, room=room)
    deliver(side, [manifest.seal(key)] + frames[255] + frames[0] + frames[1])
    side.hand_over(room)
    assert side.room_state(room) is RoomState.LANDED


def test_a_residual_that_cannot_be_applied_fails_its_request_never_the_scheduler(lynx_side, monkeypatch):
    side, host, _ = lynx_side
    landed(side)
    landed(side, room=7, slots=range(0, 20))
    upgrade = type(side.wire).upgrade

    def broken(*args):
        raise RuntimeError("upgrade bug")

    monkeypatch.setattr(type(side.wire), "upgrade", lambda wire, *args: broken(*args))
    assert side.apply_residual(ROOM) is False  # raises nothing
    monkeypatch.setattr(type(side.wire), "upgrade", upgrade)
    assert "applying the residual KV failed (RuntimeError: upgrade bug)" in side.check(ROOM)
    assert side.apply_residual(7) and side.check(7) is None


def test_a_failure_from_another_thread_inside_the_upgrade_fence_fails_the_request_not_the_scheduler(lynx_side, monkeypatch):
    side, host, _ = lynx_side
    landed(side)
    table = type(side._rooms)
    upgrading = table.upgrading

    @contextlib.contextmanager
    def failed_once_admitted(self, room):
        with upgrading(self, room) as entry:
            side.on_prefill_failure(room, "the prefill gave up")  # what another thread may do here
            yield entry

    monkeypatch.setattr(table, "upgrading", failed_once_admitted)
    assert side.apply_residual(ROOM) is False
    assert side.check(ROOM) == "the prefill gave up"
