"""`PrefillSide` against a fake pool and host: registrations, metadata, the encode fence, what it sends."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from lynx.manifest import open_manifest, wire_version
from lynx.transfer.keys import transfer_key
from lynx.transfer.transport import TransportError
from pd_fakes import AUX_LENS, SECRET, wait_for
from pd_fakes import PEER_ENDPOINT as ENDPOINT
from pd_fakes import PEER_NONCE as NONCE
from pd_fakes import PEER_SESSION as SESSION
from pd_fakes import decode_registration as registration
from pd_fakes import Recorder, recording_prefill_side
from pd_fakes import room_metadata as metadata

from lynx.pd.control import ControlError
from lynx.pd.prefill_encoder import Job
from lynx.pd.prefill_rooms import STALE_METADATA_S
from lynx.pd.prefill_side import PURGE_EVERY_S


class Clock:
    now = 50.0

    def __call__(self):
        return self.now


@pytest.fixture
def side():
    clock = Clock()
    side = recording_prefill_side(clock)
    side.clock = clock
    yield side
    side.close()


def test_a_decode_speaking_another_wire_version_is_refused_and_its_requests_fail_naming_both(side):
    with pytest.raises(ControlError, match="speaks manifest v1"):
        side.on_registration(registration(version="manifest v1, codec format v1"), AUX_LENS)
    side.on_metadata(metadata())
    (room, reason), = side.host.failures
    assert room == 9 and "manifest v1, codec format v1" in reason and wire_version() in reason


def test_a_replayed_older_registration_does_not_replace_the_newer_one(side):
    side.on_registration(registration(issued_ns=20), AUX_LENS)
    with pytest.raises(ControlError, match="stale registration"):
        side.on_registration(registration(issued_ns=10), AUX_LENS)
    assert side.peers[SESSION].issued_ns == 20


def test_metadata_naming_a_data_endpoint_off_the_decode_ranks_address_is_refused(side):
    side.on_registration(registration(), AUX_LENS)
    with pytest.raises(ControlError, match="not on the sending decode rank"):
        side.on_metadata(metadata(endpoint="tcp://10.1.2.3:6000"))
    assert side.host.ready == []


def test_the_room_is_sent_to_its_endpoint_with_its_own_transfer_key(side):
    side.on_registration(registration(), AUX_LENS)
    side.on_metadata(metadata())
    assert side.host.ready == [(9, 0)] and side.claim(9)
    side.start()
    side.add_chunk(9, np.arange(10, 30), True, 2, 20)
    assert wait_for(lambda: side.host.succeeded) and side.sender.wait_idle(30)
    assert side.host.succeeded == [9]
    sent = side.transport.sent
    assert {endpoint for endpoint, _ in sent} == {ENDPOINT}
    manifest = open_manifest(sent[0][1], transfer_key(SECRET, NONCE))
    assert manifest.num_tokens == 20 and manifest.mode == "int8"


@pytest.mark.parametrize("mode", ["lynx", "int8"])
def test_a_room_is_reported_sent_once_every_stream_is_queued_with_the_bytes_it_sends(mode):
    side = recording_prefill_side(mode=mode)
    at_success = []
    side.host.succeed = lambda room: at_success.append((side.sender.stats(), side.wire_bytes(room)))
    try:
        side.on_registration(registration(), AUX_LENS)
        side.on_metadata(metadata())
        assert side.claim(9) and side.wire_bytes(9) is None
        side.start()
        side.add_chunk(9, np.arange(10, 30), True, 2, 20)
        assert wait_for(lambda: at_success) and side.encoder.drain(30) and side.sender.wait_idle(30)
        final = side.sender.stats()
        side.release(9)
        assert side.wire_bytes(9) is None
    finally:
        side.close()
    ((then, wire_bytes),) = at_success
    sent = sum(final.sent_bytes_by_class.values())
    assert then.queued_bytes + sum(then.sent_bytes_by_class.values()) == sent
    manifest = sum(len(part) for part in side.transport.sent[0][1])
    assert wire_bytes == sent - manifest  # every stream and the metadata, as SGLang's transfer metric reports them


class ResetAfterGate(Recorder):
    """A link that holds its first message until `gate` is set, then fails it (a reset peer)."""

    def __init__(self):
        super().__init__()
        self.gate = threading.Event()

    def send(self, endpoint, parts):
        self.gate.wait(30)
        raise TransportError("the listener ended the session")


@pytest.mark.parametrize("mode", ["lynx", "int8"])
def test_a_failed_send_of_bytes_queued_after_the_room_was_released_still_fails_it_at_its_decode_ranks(mode):
    """The prefill reports a room sent once its streams are queued, and SGLang's sender then ends:
    the room is forgotten with its bytes still queued. If the link fails them later, the decode
    ranks waiting for them must still be told, or they wait without a deadline (no manifest came)."""
    side = recording_prefill_side(mode=mode)
    side.transport = side.sender._transport = link = ResetAfterGate()
    try:
        side.on_registration(registration(), AUX_LENS)
        side.on_metadata(metadata())
        assert side.claim(9)
        side.start()
        side.add_chunk(9, np.arange(10, 30), True, 2, 20)
        assert wait_for(lambda: side.host.succeeded) and side.encoder.drain(30)
        assert side.sender.queued(9) or any(side.sender.queued(w) for w in side._rooms.wires(9))
        side.release(9)  # SGLang's sender is done with the room
        link.gate.set()
        assert wait_for(lambda: side.host.failures) and side.sender.wait_idle(30)
    finally:
        side.close()
    (room, reason), = side.host.failures
    assert room == 9 and reason == "the listener ended the session"
    assert side.host.notified == [(9, (("127.0.0.1", 5000),))], "the decode rank is told"
    assert side._unsent == {}, "nothing is kept once the bytes are gone"


def test_bytes_of_a_released_room_that_all_left_keep_nothing_of_it(side):
    side.on_registration(registration(), AUX_LENS)
    side.on_metadata(metadata())
    side.claim(9)
    side.start()
    side.add_chunk(9, np.arange(10, 30), True, 2, 20)
    assert wait_for(lambda: side.host.succeeded) and side.encoder.drain(30) and side.sender.wait_idle(30)
    side.release(9)
    assert side._unsent == {} and side.host.failures == []


def test_a_token_count_other_than_the_decode_reservation_fails_the_room(side):
    side.on_registration(registration(), AUX_LENS)
    side.on_metadata(metadata(tokens=21))
    side.claim(9)
    side.add_chunk(9, np.arange(10, 30), True, 2, 20)
    (room, reason), = side.host.failures
    assert "reserved 21 tokens, this prefill has 20" in reason and side.transport.sent == []


class SlowEncode:
    """Holds the wire's encoder up inside its read of the pool until `finish` is set."""

    def __init__(self, side, monkeypatch):
        self.reading, self.finish = threading.Event(), threading.Event()
        encode = side.wire.encode

        def slow_encode(*args):
            self.reading.set()
            self.finish.wait(10)
            return encode(*args)

        monkeypatch.setattr(type(side.wire), "encode", lambda wire, *args: slow_encode(*args))


def start_encoding_segment_0(side, monkeypatch):
    """Room 9 ready and claimed, its first segment held up in the encoder (a thread); returns both."""
    side.on_registration(registration(), AUX_LENS)
    side.on_metadata(metadata())
    slow = SlowEncode(side, monkeypatch)
    encoder = threading.Thread(target=side.encoder.send, args=(Job(9, 0, 0, np.arange(10, 30), 20),))
    encoder.start()
    assert slow.reading.wait(10)
    return slow, encoder


def test_an_abort_while_encoding_holds_the_pages_and_nothing_is_sent(side, monkeypatch):
    side.claim(9)
    slow, encoder = start_encoding_segment_0(side, monkeypatch)
    side.abort(9)
    assert side.busy(9), "the pages must not be freed while the encoder reads them"
    slow.finish.set()
    encoder.join(10)
    assert not side.busy(9)
    stats = side.sender.stats()  # the sender is not started: whatever was submitted would still be queued
    assert stats.queued_bytes == 0 and stats.chunks_sent == 0
    assert side.transport.sent == [] and side.host.succeeded == []


class SenderManager:
    """What SGLang's `CommonKVSender` reads of its manager, around a real `PrefillSide`."""

    sender_trace_module = None
    deferred_bootstrap = None
    is_dummy_cp_rank = False
    defer_decode_allocation = False
    reports_transfer_latency = False
    bootstrap_timeout = 300.0
    broken = None

    def __init__(self, side):
        self.side = side
        self.request_status, self.failure_records, self._staging_outstanding = {}, {}, {}

    def update_status(self, room, status):
        self.request_status[room] = status

    def check_status(self, room):
        return self.request_status[room]

    def record_failure(self, room, reason):
        self.failure_records[room] = reason


def test_sglangs_sender_polls_transferring_while_the_encoder_reads_the_pages_of_its_aborted_room(side, monkeypatch):
    from sglang.srt.disaggregation.base.conn import KVPoll
    from sglang.srt.runtime_context import get_parallel

    from lynx_patches.pd.conn import LynxKVSender

    manager = SenderManager(side)
    with get_parallel().override(num_dp_ranks=1):
        sender = LynxKVSender(manager, "bootstrap:8998", 9)
    manager.update_status(9, KVPoll.Transferring)
    slow, encoder = start_encoding_segment_0(side, monkeypatch)
    sender.abort()
    assert manager.request_status[9] == KVPoll.Failed
    assert sender.poll() == KVPoll.Transferring and sender.poll() == KVPoll.Transferring
    slow.finish.set()
    encoder.join(10)
    assert sender.poll() == KVPoll.Failed


def test_metadata_of_rooms_no_request_claimed_is_purged_after_a_while(side):
    side.on_registration(registration(), AUX_LENS)
    side.on_metadata(metadata(room=1))
    side.on_metadata(metadata(room=2))
    side.claim(2)
    side.clock.now += STALE_METADATA_S + 1
    side.purge()
    assert side.rooms_by_state()["metadata"] == 1
    side.release(2)
    assert side.rooms_by_state()["metadata"] == 0


def test_the_alive_thread_purges_unclaimed_metadata_once_it_is_stale(side):
    side.on_registration(registration(), AUX_LENS)
    side.on_metadata(metadata(room=1))
    side.start()
    side.clock.now += STALE_METADATA_S + PURGE_EVERY_S + 1
    assert wait_for(lambda: side.rooms_by_state()["metadata"] == 0, timeout_s=10)


def test_a_second_live_sender_for_a_room_is_refused(side):
    assert side.claim(5) and not side.claim(5)
    side.release(5)
    assert side.claim(5)



def test_each_rooms_metadata_gives_the_sender_its_draft_window():
    import dataclasses

    side = recording_prefill_side(mode="lynx", residual_priority="deadline")
    try:
        side.on_registration(registration(), AUX_LENS)
        side.on_metadata(dataclasses.replace(metadata(room=31), draft_window_ms=1250))
        assert side.sender._queues.deadlines.backlogs() == []
        assert side.sender._queues.deadlines._rooms[31].window_s == 1.25
    finally:
        side.close()


def test_the_residual_priority_option_picks_the_senders_deadline_rule():
    paced = 0.008 * 1e9 / 8  # bytes/s of --lynx-link-gbps 0.008
    for priority, gbps, fifo, window in (("finish", 0.008, paced, 0.0), ("finish", 0.0, None, 0.0),
                                         ("deadline", 0.008, None, 0.0), ("strict", 0.008, None, None)):  # fmt: skip
        side = recording_prefill_side(mode="lynx", residual_priority=priority, link_gbps=gbps)
        try:
            deadlines = side.sender._queues.deadlines
            assert (deadlines.fifo_bytes_per_s, deadlines.window_s) == (fifo, window), (priority, gbps)
        finally:
            side.close()
