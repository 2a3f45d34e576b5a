"""MooncakeTransport and MooncakeListener with the real engine over TCP on 127.0.0.1.

The engine listens on every interface whatever address it is given, so these
tests run only inside a private network namespace that has nothing but
loopback: `test_isolated.py` runs this module there.
"""

import hashlib
import json
import os
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import zmq

from lynx_testing.netns import INSIDE_ENV  # noqa: E402

if os.environ.get(INSIDE_ENV) != "1":
    pytest.skip("runs inside a private network namespace (test_isolated.py)", allow_module_level=True)
pytest.importorskip("mooncake.engine", reason="the mooncake extra (mooncake-transfer-engine-non-cuda) is not installed")

from lynx.transfer.frames import AUX_STREAM, FrameAuthError, FrameHeader, decode_frame, encode_frame  # noqa: E402
from lynx.transfer.keys import curve_keys  # noqa: E402
from lynx.transfer.mooncake.control import (  # noqa: E402
    NONCE_BYTES,
    Auth,
    Challenge,
    Hello,
    MooncakeEndpoint,
    Notify,
    Reset,
    Session,
    decode,
    encode,
)
from lynx.transfer.mooncake.engine import MooncakeEngine, WriteStatus  # noqa: E402
from lynx.transfer.mooncake.transport import MooncakeListener, MooncakeTransport  # noqa: E402
from lynx.transfer.sender import PrioritySender  # noqa: E402
from lynx.transfer.transport import TransportError  # noqa: E402

RECEIVER = Path(__file__).parent.with_name("mooncake_receiver_process.py")
KEY = b"mooncake-test-secret"


@pytest.fixture
def receiver():
    """Start receiver processes; each is killed by pid at teardown, whatever happened."""
    children = []

    def start(mode, key=KEY, **options):
        command = [sys.executable, str(RECEIVER), "--key", key.hex(), "--mode", mode]
        for name, value in options.items():
            command += [f"--{name.replace('_', '-')}", value if isinstance(value, str) else json.dumps(value)]
        env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOG_minloglevel": "2"}
        child = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=env)
        children.append(child)
        line = child.stdout.readline()
        assert line, "receiver process exited before reporting its endpoint"
        return child, json.loads(line)["endpoint"]

    yield start
    for child in children:
        if child.poll() is None:
            child.kill()
        child.wait(timeout=30)


def result_of(child):
    output, _ = child.communicate(timeout=120)
    assert child.returncode == 0
    return json.loads(output.strip().splitlines()[-1])


class Drain:
    """Calls ``listener.recv`` on a thread (handshakes and credits need it) and queues what arrives."""

    def __init__(self, listener):
        self.listener, self.messages, self._stop = listener, queue.Queue(), threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        while not self._stop.is_set():
            parts = self.listener.recv(0.05)
            if parts is not None:
                self.messages.put([bytes(part) for part in parts])

    def stop(self):
        self._stop.set()
        self._thread.join()


def random_message(rng, index):
    layout = rng.integers(0, 4)
    sizes = [[0], [int(rng.integers(1, 4096))], [int(rng.integers(4097, 60_000))],
             [38, int(rng.integers(0, 60_000)), int(rng.integers(0, 3000))]][layout]
    return [f"{index}:".encode() + rng.bytes(size)[: max(0, size - 8)] for size in sizes]


def test_messages_arrive_intact_and_in_order_in_another_process(receiver):
    rng = np.random.default_rng(7)
    messages = [random_message(rng, index) for index in range(300)]
    child, endpoint = receiver("raw", messages=len(messages), slots=4, slot_bytes=1 << 16)
    with MooncakeTransport(KEY, send_timeout_s=20, staging_slots=3, staging_slot_bytes=1 << 16) as transport:
        for parts in messages:
            transport.send(endpoint, parts)
        result = result_of(child)
    expected = [[[len(part) for part in parts], hashlib.sha256(b"".join(parts)).hexdigest()] for parts in messages]
    assert result["messages"] == expected
    assert result["rejected"] == 0


def test_priority_sender_streams_over_mooncake_reassemble_byte_exact(receiver):
    streams = {11: {0: os.urandom(150_000), 1: os.urandom(70_001), AUX_STREAM: b"meta"},
               12: {0: os.urandom(999), 1: os.urandom(40_000), 2: b""}}
    expect = {room: {stream: len(data) for stream, data in sizes.items()} for room, sizes in streams.items()}
    child, endpoint = receiver("frames", expect=expect, slot_bytes=1 << 16)
    with MooncakeTransport(KEY, send_timeout_s=20) as transport:
        with PrioritySender(transport, KEY, chunk_bytes=16_384) as sender:
            for room, sizes in streams.items():
                for stream, data in sizes.items():
                    sender.submit(endpoint, room, stream, data)
            assert sender.wait_idle(timeout_s=60)
            result = result_of(child)
    assert result["errors"] == []
    assert result["sha256"] == {str(room): {str(s): hashlib.sha256(d).hexdigest() for s, d in sizes.items()}
                                for room, sizes in streams.items()}


def test_frames_signed_with_another_frame_key_fail_authentication_at_the_receiver(receiver):
    child, endpoint = receiver("frames", expect={5: {0: 50_000}}, idle_timeout_s=2.0)
    with MooncakeTransport(KEY, send_timeout_s=20) as transport:
        with PrioritySender(transport, b"not-the-receivers-secret", chunk_bytes=16_384) as sender:
            sender.submit(endpoint, 5, 0, os.urandom(50_000))
            result = result_of(child)
    assert result["errors"] == ["FrameAuthError"] * 4
    assert result["sha256"] == {"5": {}}


def test_credits_bound_the_arena_and_an_unread_slot_is_never_overwritten():
    listener = MooncakeListener(KEY, slots=2, slot_bytes=1 << 16)
    transport = MooncakeTransport(KEY, send_timeout_s=2.0, staging_slots=3, staging_slot_bytes=1 << 16)
    try:
        transport.send(listener.endpoint, [b"probe"])
        while listener.recv(0.05) is None:
            pass
        messages = [[bytes([index]) * 50_000] for index in range(1, 10)]
        with pytest.raises(TransportError, match="credit"):
            for parts in messages:
                transport.send(listener.endpoint, parts)
        received = []
        while (parts := listener.recv(0.5)) is not None:
            received.append(parts)
        assert received == messages[:2], "more messages than slots reached the arena, or a slot was overwritten"
    finally:
        transport.close()
        listener.close()


def test_dead_receiver_makes_send_raise_within_the_timeout(receiver):
    child, endpoint = receiver("raw", messages=10**9, slot_bytes=1 << 16)
    timeout_s = 3.0
    with MooncakeTransport(KEY, send_timeout_s=timeout_s, staging_slots=4, staging_slot_bytes=1 << 16) as transport:
        transport.send(endpoint, [os.urandom(50_000)])
        child.kill()
        child.wait(timeout=30)
        started = time.monotonic()
        with pytest.raises(TransportError):
            while time.monotonic() - started < 20 * timeout_s:
                transport.send(endpoint, [os.urandom(50_000)])


@pytest.mark.parametrize("curve_secret", [None, b"a-guessed-secret-of-16+ bytes"])
def test_a_peer_without_the_secret_gets_no_byte_to_the_listener(curve_secret):
    listener = MooncakeListener(KEY, slots=2, slot_bytes=1 << 16)
    context = zmq.Context()
    socket = context.socket(zmq.DEALER)
    socket.setsockopt(zmq.LINGER, 0)
    socket.setsockopt(zmq.SNDTIMEO, 0)
    if curve_secret is not None:
        guessed = curve_keys(curve_secret)
        socket.curve_serverkey, socket.curve_publickey = guessed.server_public, guessed.client_public
        socket.curve_secretkey = guessed.client_secret
    try:
        socket.connect(MooncakeEndpoint.parse(listener.endpoint).control)
        guessed_session = Session(curve_secret or b"", b"s" * NONCE_BYTES, b"l" * NONCE_BYTES)
        for message in (Hello(b"s" * NONCE_BYTES), guessed_session.sign(Notify(0, 0, (50_000,), ()))):
            try:
                socket.send_multipart(encode(message))
            except zmq.Again:
                pass
        assert listener.recv(1.0) is None
        assert socket.poll(500) == 0, "the listener answered a peer without the secret"
        stats = listener.stats()
        assert (stats.sessions, stats.messages, stats.rejected) == (0, 0, 0), "a byte got through"
    finally:
        socket.close()
        context.term()
        listener.close()


def test_without_curve_the_session_macs_alone_drop_unsigned_control_messages_and_read_no_arena_bytes():
    listener = MooncakeListener(b"", slots=2, slot_bytes=1 << 16)
    context = zmq.Context()
    socket = context.socket(zmq.DEALER)
    socket.setsockopt(zmq.LINGER, 0)
    socket.setsockopt(zmq.RCVTIMEO, 5000)
    try:
        socket.connect(MooncakeEndpoint.parse(listener.endpoint).control)
        nonce = os.urandom(NONCE_BYTES)
        socket.send_multipart(encode(Hello(nonce)))
        assert listener.recv(0.5) is None
        challenge = decode(socket.recv_multipart())
        assert isinstance(challenge, Challenge)
        forged = Session(b"guessed-secret", nonce, challenge.nonce)
        socket.send_multipart(encode(Auth(forged.auth_tag())))
        assert listener.recv(0.5) is None
        assert isinstance(decode(socket.recv_multipart()), Reset)
        socket.send_multipart(encode(forged.sign(Notify(0, 0, (50_000,), ()))))
        socket.send_multipart(encode(Notify(0, 1, (50_000,), (), b"\0" * 16)))
        assert listener.recv(0.5) is None
        stats = listener.stats()
        assert (stats.sessions, stats.messages, stats.rejected) == (0, 0, 3)
    finally:
        socket.close()
        context.term()
        listener.close()


def test_a_forged_payload_written_into_the_arena_fails_the_frame_mac_unless_copied_out_first():
    for copy in (False, True):
        listener = MooncakeListener(KEY, slots=1, slot_bytes=1 << 16, copy=copy)
        attacker = MooncakeEngine()
        transport = MooncakeTransport(KEY, send_timeout_s=10)
        try:
            header = FrameHeader(9, 0, 0, 1, 0, 50_000, 0, 0)
            transport.send(listener.endpoint, encode_frame(header, os.urandom(50_000), KEY))
            while (parts := listener.recv(0.05)) is None:
                pass
            endpoint = MooncakeEndpoint.parse(listener.endpoint)
            forged = np.zeros(50_000, dtype=np.uint8)
            handle = attacker.write(endpoint.session, attacker.register(forged), endpoint.slot_address(0), 50_000)
            while (status := attacker.status(handle)) is WriteStatus.PENDING:
                time.sleep(0.001)
            assert status is WriteStatus.DONE, "the engine refused a write into the registered arena"
            if copy:
                assert decode_frame(parts, KEY, 1 << 16)[0] == header
            else:
                with pytest.raises(FrameAuthError):
                    decode_frame(parts, KEY, 1 << 16)
        finally:
            transport.close()
            attacker.close()
            listener.close()


def test_a_sender_with_another_secret_fails_with_a_clear_error():
    listener = MooncakeListener(KEY)
    drain = Drain(listener)
    try:
        with MooncakeTransport(b"another-secret-of-16+ bytes", send_timeout_s=2) as transport:
            with pytest.raises(TransportError, match="shared secret"):
                for _ in range(1000):
                    transport.send(listener.endpoint, [b"hello"])
                    time.sleep(0.01)
        assert drain.messages.empty()
    finally:
        drain.stop()
        listener.close()


def test_closing_is_idempotent_and_later_use_raises():
    listener = MooncakeListener(KEY)
    transport = MooncakeTransport(KEY, send_timeout_s=5)
    drain = Drain(listener)
    transport.send(listener.endpoint, [b"x" * 10_000])
    assert drain.messages.get(timeout=30) == [b"x" * 10_000]
    drain.stop()
    transport.close()
    transport.close()
    listener.close()
    listener.close()
    with pytest.raises(TransportError):
        transport.send(listener.endpoint, [b"late"])
    with pytest.raises(TransportError):
        listener.recv(0.01)


def test_a_message_too_large_for_the_listeners_slots_is_refused():
    listener = MooncakeListener(KEY, slots=1, slot_bytes=8192)
    try:
        with MooncakeTransport(KEY, send_timeout_s=5) as transport:
            with pytest.raises(TransportError, match="slots hold 8192"):
                transport.send(listener.endpoint, [b"h" * 100, b"p" * 9000])
    finally:
        listener.close()
