"""The priority sender against an in-memory transport: order, bounds, failures, callbacks."""

import threading

import numpy as np
import pytest
import torch

from lynx.transfer.frames import AUX_STREAM, decode_frame
from lynx.transfer.reassembly import RequestAssembly
from lynx.transfer.sender import PrioritySender
from lynx.transfer.transport import Transport, TransportError

KEY = b"secret"
PEER, OTHER_PEER = "peer-a", "peer-b"


class RecordingTransport(Transport):
    """Decodes and records every frame; raises for endpoints in ``dead``."""

    def __init__(self, dead=(), stalled=()):
        self.dead = set(dead)
        self.stalled = set(stalled)
        self.sent = []
        self.messages = []
        self.closed = False

    def ready(self, endpoint):
        return endpoint not in self.stalled

    def send(self, endpoint, parts):
        if endpoint in self.dead:
            raise TransportError(f"send to {endpoint} timed out")
        if parts[0] == b"MESSAGE":
            self.messages.append((endpoint, len(self.sent)))
            return
        header, payload = decode_frame([bytes(part) for part in parts], KEY, max_payload=1 << 20)
        self.sent.append((endpoint, header, bytes(payload)))

    def close(self):
        self.closed = True

    def order(self):
        return [(header.room, header.stream, header.chunk_index) for _, header, _ in self.sent]


def wait_for(condition, timeout_s=10.0):
    done = threading.Event()
    for _ in range(int(timeout_s / 0.01)):
        if condition():
            return True
        done.wait(0.01)
    return condition()


def run_to_idle(sender):
    sender.start()
    assert sender.wait_idle(timeout_s=30)


def test_new_anchor_overtakes_queued_residuals_and_fifo_holds_within_a_class():
    transport = RecordingTransport()
    sender = PrioritySender(transport, KEY, chunk_bytes=4)
    sender.submit(PEER, 1, 1, b"r" * 12)
    sender.submit(OTHER_PEER, 2, 1, b"s" * 8)
    sender.submit(PEER, 3, 2, b"t" * 4)
    sender.submit(OTHER_PEER, 4, 0, b"a" * 8)
    sender.submit(PEER, 4, AUX_STREAM, b"meta")
    run_to_idle(sender)
    sender.close()
    assert transport.order() == [
        (4, 0, 0), (4, 0, 1), (4, AUX_STREAM, 0),
        (1, 1, 0), (1, 1, 1), (1, 1, 2), (2, 1, 0), (2, 1, 1),
        (3, 2, 0),
    ]
    stats = sender.stats()
    assert dict(stats.sent_bytes_by_class) == {0: 12, 1: 20, 2: 4}
    assert (stats.chunks_sent, stats.chunks_dropped, stats.queued_bytes) == (9, 0, 0)


def test_streams_reassemble_exactly_from_any_supported_buffer():
    rng = np.random.default_rng(0)
    streams = {
        0: rng.integers(0, 256, 1000, dtype=np.uint8),
        1: torch.randint(0, 256, (3, 37), dtype=torch.uint8).t(),
        2: bytearray(rng.bytes(77)),
        AUX_STREAM: b"",
    }
    expected = {
        0: streams[0].tobytes(), 1: streams[1].contiguous().numpy().tobytes(), 2: bytes(streams[2]), AUX_STREAM: b""
    }
    transport = RecordingTransport()
    with PrioritySender(transport, KEY, chunk_bytes=64) as sender:
        for stream, data in streams.items():
            sender.submit(PEER, 9, stream, data)
        assert sender.wait_idle(timeout_s=30)
    assembly = RequestAssembly(9, {stream: len(data) for stream, data in expected.items()})
    for _, header, payload in transport.sent:
        assembly.accept(header, payload)
    assert {stream: assembly.buffer(stream).tobytes() for stream in expected} == expected


@pytest.mark.parametrize("data", [np.zeros(4, dtype=np.float32), torch.zeros(4), [1, 2, 3], "text"])
def test_non_byte_buffers_are_value_errors(data):
    sender = PrioritySender(RecordingTransport(), KEY)
    with pytest.raises(ValueError):
        sender.submit(PEER, 1, 0, data)


def test_frames_carry_the_layers_they_overlap():
    transport = RecordingTransport()
    sender = PrioritySender(transport, KEY, chunk_bytes=10)
    sender.submit(PEER, 1, 0, b"x" * 30, layer_bounds=[0, 5, 15, 15, 30])
    run_to_idle(sender)
    sender.close()
    assert [(h.layer_start, h.layer_end) for _, h, _ in transport.sent] == [(0, 2), (1, 4), (3, 4)]
    with pytest.raises(ValueError):
        sender.submit(PEER, 1, 0, b"x" * 30, layer_bounds=[0, 29])


def test_every_chunk_goes_through_the_pacer_in_send_order():
    class RecordingPacer:
        def __init__(self):
            self.sizes = []

        def reserve(self, nbytes, now):
            self.sizes.append(nbytes)
            return 0.0

    pacer = RecordingPacer()
    transport = RecordingTransport()
    sender = PrioritySender(transport, KEY, chunk_bytes=4, pacer=pacer)
    sender.submit(PEER, 1, 1, b"r" * 6)
    sender.submit(PEER, 2, 0, b"a" * 3)
    run_to_idle(sender)
    sender.close()
    assert pacer.sizes == [3, 4, 2] == [len(payload) for _, _, payload in transport.sent]


def test_cancel_drops_only_that_rooms_queued_chunks():
    transport = RecordingTransport()
    sender = PrioritySender(transport, KEY, chunk_bytes=4)
    sender.submit(PEER, 1, 0, b"a" * 8)
    sender.submit(PEER, 2, 0, b"b" * 8)
    sender.submit(OTHER_PEER, 1, 1, b"c" * 4)
    assert sender.cancel(1) == 3
    assert sender.stats().queued_bytes == 8
    run_to_idle(sender)
    sender.close()
    assert {header.room for _, header, _ in transport.sent} == {2}
    assert sender.stats().chunks_dropped == 3


def test_failed_endpoint_fails_each_affected_room_once_and_others_still_flow():
    errors, sent = [], []
    transport = RecordingTransport(dead={PEER})
    sender = PrioritySender(
        transport, KEY, chunk_bytes=4, on_error=lambda room, message: errors.append((room, message)),
        on_sent=lambda room, stream: sent.append((room, stream)),
    )
    sender.submit(PEER, 1, 0, b"a" * 8)
    sender.submit(PEER, 1, 1, b"a" * 8)
    sender.submit(PEER, 2, 1, b"b" * 8)
    sender.submit(OTHER_PEER, 3, 1, b"c" * 8)
    run_to_idle(sender)
    sender.close()
    assert sorted(room for room, _ in errors) == [1, 2]
    assert all(PEER in message for _, message in errors)
    assert transport.order() == [(3, 1, 0), (3, 1, 1)]
    assert sent == [(3, 1)]
    assert sender.stats().queued_bytes == 0


def test_callback_exceptions_do_not_stop_the_worker():
    def explode(room, stream):
        raise RuntimeError("callback bug")

    transport = RecordingTransport()
    sender = PrioritySender(transport, KEY, on_sent=explode)
    sender.submit(PEER, 1, 0, b"x")
    sender.submit(PEER, 2, 0, b"y")
    run_to_idle(sender)
    sender.close()
    assert transport.order() == [(1, 0, 0), (2, 0, 0)]


class FailingPacer:
    """A pacer that raises on its first ``failures`` reservations, then lets everything through."""

    def __init__(self, failures):
        self.failures = failures

    def reserve(self, nbytes, now):
        if self.failures > 0:
            self.failures -= 1
            raise RuntimeError("pacer bug")
        return 0.0


def test_a_crashed_worker_fails_the_rooms_it_carried_and_sends_again_after_its_restart():
    errors, failed = [], threading.Event()
    transport = RecordingTransport()
    on_error = lambda room, message: (errors.append((room, message)), failed.set())  # noqa: E731
    sender = PrioritySender(
        transport, KEY, chunk_bytes=4, pacer=FailingPacer(1), on_error=on_error, restart_backoff_s=0
    )
    sender.submit(PEER, 1, 0, b"a" * 8)
    sender.submit(OTHER_PEER, 2, 1, b"r" * 8)
    sender.submit(PEER, 1, 1, b"s" * 4)
    sender.start()
    assert failed.wait(10)
    assert sender.wait_idle(timeout_s=10) and sender.stats().queued_bytes == 0
    assert sorted(room for room, _ in errors) == [1, 2]
    assert all("sender's worker failed (RuntimeError: pacer bug)" in message for _, message in errors)
    sender.submit(PEER, 3, 0, b"b" * 4)
    assert sender.wait_idle(timeout_s=10)
    sender.close()
    assert transport.order() == [(3, 0, 0)] and sender.broken is None


def test_a_worker_that_keeps_crashing_marks_the_sender_broken_and_new_work_is_refused():
    errors = []
    sender = PrioritySender(
        RecordingTransport(), KEY, pacer=FailingPacer(1000), on_error=lambda room, message: errors.append(room),
        restart_backoff_s=0,
    )  # fmt: skip
    sender.start()
    for room in range(20):
        if sender.broken is not None:
            break
        sender.submit(PEER, room, 0, b"x")
        assert wait_for(lambda: room in errors)
    assert sender.broken is not None and "pacer bug" in sender.broken
    assert errors == list(range(room)) and room > 1
    with pytest.raises(TransportError, match="broken"):
        sender.submit(PEER, 99, 0, b"x")
    with pytest.raises(TransportError, match="broken"):
        sender.submit_message(PEER, 99, [b"MESSAGE"])
    sender.close()


def test_submission_larger_than_the_inflight_bound_is_a_value_error():
    sender = PrioritySender(RecordingTransport(), KEY, max_inflight_bytes=100)
    with pytest.raises(ValueError, match="max_inflight_bytes"):
        sender.submit(PEER, 1, 0, b"x" * 101)


def test_submit_times_out_when_the_endpoint_queue_stays_full():
    sender = PrioritySender(RecordingTransport(), KEY, max_inflight_bytes=100, submit_timeout_s=0.2)
    sender.submit(PEER, 1, 1, b"x" * 80)
    sender.submit(OTHER_PEER, 2, 1, b"x" * 80)
    with pytest.raises(TransportError, match=PEER):
        sender.submit(PEER, 3, 0, b"x" * 30)
    assert sender.stats().queued_bytes == 160


def test_blocked_submit_proceeds_once_queued_bytes_are_sent():
    transport = RecordingTransport()
    sender = PrioritySender(transport, KEY, chunk_bytes=10, max_inflight_bytes=100)
    sender.submit(PEER, 1, 1, b"x" * 90)
    entered, done = threading.Event(), threading.Event()

    def submit_more():
        entered.set()
        sender.submit(PEER, 2, 0, b"y" * 50)
        done.set()

    worker = threading.Thread(target=submit_more)
    worker.start()
    assert entered.wait(10)
    assert not done.is_set()
    run_to_idle(sender)
    worker.join(10)
    assert done.is_set()
    assert sender.wait_idle(timeout_s=30)
    sender.close()
    assert sum(len(payload) for _, _, payload in transport.sent) == 140


def test_close_drops_queued_chunks_and_refuses_new_work():
    sender = PrioritySender(RecordingTransport(), KEY, chunk_bytes=4)
    sender.submit(PEER, 1, 1, b"x" * 12)
    sender.close()
    sender.close()
    assert sender.stats().chunks_dropped == 3
    with pytest.raises(TransportError, match="closed"):
        sender.submit(PEER, 1, 0, b"x")
    with pytest.raises(TransportError):
        sender.start()


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(chunk_bytes=0),
        dict(chunk_bytes=1 << 32),
        dict(max_inflight_bytes=0),
        dict(submit_timeout_s=-1),
        dict(stall_timeout_s=0),
    ],
)
def test_invalid_sender_settings_are_value_errors(kwargs):
    with pytest.raises(ValueError):
        PrioritySender(RecordingTransport(), KEY, **kwargs)


def test_a_stalled_peer_is_skipped_and_does_not_hold_up_another_peer():
    transport = RecordingTransport(stalled={PEER})
    errors = []
    sender = PrioritySender(transport, KEY, chunk_bytes=4, on_error=lambda room, msg: errors.append(room))
    sender.submit(PEER, 1, 0, b"a" * 8)
    sender.submit(OTHER_PEER, 2, 1, b"r" * 8)
    sender.start()
    deadline = threading.Event()
    for _ in range(200):
        if len(transport.sent) == 2:
            break
        deadline.wait(0.01)
    assert [(h.room, h.stream) for _, h, _ in transport.sent] == [(2, 1), (2, 1)]
    transport.stalled.clear()
    assert sender.wait_idle(timeout_s=30)
    sender.close()
    assert [h.room for _, h, _ in transport.sent][2:] == [1, 1] and errors == []


def test_a_peer_stalled_past_the_timeout_is_given_up_and_its_rooms_reported():
    transport = RecordingTransport(stalled={PEER})
    failed = threading.Event()
    errors = []

    def on_error(room, message):
        errors.append((room, message))
        failed.set()

    sender = PrioritySender(transport, KEY, chunk_bytes=4, on_error=on_error, stall_timeout_s=0.05)
    sender.submit(PEER, 5, 0, b"a" * 8)
    sender.submit(PEER, 6, 1, b"r" * 8)
    sender.start()
    assert failed.wait(30) and sender.wait_idle(timeout_s=30)
    sender.close()
    assert sorted(room for room, _ in errors) == [5, 6]
    assert "took no data" in errors[0][1] and transport.sent == []


def test_a_message_goes_before_frames_submitted_after_it_and_after_earlier_anchors():
    transport = RecordingTransport()
    sender = PrioritySender(transport, KEY, chunk_bytes=4)
    sender.submit(PEER, 1, 0, b"a" * 4)
    sender.submit(PEER, 1, 1, b"r" * 4)
    sender.submit_message(PEER, 2, [b"MESSAGE", b"manifest of room 2"])
    sender.submit(PEER, 2, 0, b"b" * 4)
    run_to_idle(sender)
    sender.close()
    assert transport.messages == [(PEER, 1)]
    assert transport.order() == [(1, 0, 0), (2, 0, 0), (1, 1, 0)]


def test_submit_without_waiting_refuses_a_stream_that_does_not_fit():
    sender = PrioritySender(RecordingTransport(), KEY, chunk_bytes=4, max_inflight_bytes=8, submit_timeout_s=0)
    sender.submit(PEER, 1, 1, b"r" * 8)
    with pytest.raises(TransportError, match="no room"):
        sender.submit(PEER, 2, 1, b"s" * 4)
    sender.close()
