"""PrioritySender + ZmqTransport to a receiver in another process over TCP on 127.0.0.1."""

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lynx.transfer.frames import AUX_STREAM
from lynx.transfer.pacer import TokenBucket
from lynx.transfer.sender import PrioritySender
from lynx.transfer.zmq_transport import ZmqTransport

RECEIVER = Path(__file__).with_name("receiver_process.py")
KEY = b"two-process-secret"


@pytest.fixture
def receiver():
    """Start receivers; every child is killed by pid at teardown, whatever happened."""
    children = []

    def start(expect, key=KEY, max_payload=1 << 16, **options):
        command = [
            sys.executable, str(RECEIVER), "--key", key.hex(), "--max-payload", str(max_payload),
            "--expect", json.dumps({str(room): sizes for room, sizes in expect.items()}),
        ]
        for name, value in options.items():
            command += [f"--{name.replace('_', '-')}", str(value)]
        child = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
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
    output, _ = child.communicate(timeout=60)
    assert child.returncode == 0
    return json.loads(output.strip().splitlines()[-1])


def wait_until(predicate, timeout_s=30.0):
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.005)


def test_random_streams_of_several_requests_arrive_byte_exact(receiver):
    rng_bytes = [os.urandom(size) for size in (150_000, 70_001, 0, 999, 40_000, 12, 65_536, 1)]
    streams = {
        101: {0: rng_bytes[0], 1: rng_bytes[1], AUX_STREAM: rng_bytes[5]},
        102: {0: rng_bytes[2], 1: rng_bytes[3], 2: rng_bytes[4], AUX_STREAM: rng_bytes[7]},
        103: {0: rng_bytes[6], AUX_STREAM: b"meta"},
    }
    child, endpoint = receiver({room: {s: len(d) for s, d in sizes.items()} for room, sizes in streams.items()})
    with ZmqTransport(send_timeout_s=10) as transport, PrioritySender(transport, KEY, chunk_bytes=16_384) as sender:
        for room, sizes in streams.items():
            for stream, data in sizes.items():
                sender.submit(endpoint, room, stream, data)
        assert sender.wait_idle(timeout_s=60)
        result = result_of(child)
    assert result["errors"] == []
    expected = {
        str(room): {str(stream): hashlib.sha256(data).hexdigest() for stream, data in sizes.items()}
        for room, sizes in streams.items()
    }
    assert result["sha256"] == expected


def test_later_anchor_arrives_before_remaining_residuals_of_older_requests(receiver):
    chunk = 1024
    residual, anchor, aux = os.urandom(48 * chunk), os.urandom(4 * chunk), b"aux"
    expect = {1: {1: len(residual)}, 2: {1: len(residual)}, 3: {0: len(anchor), AUX_STREAM: len(aux)}}
    child, endpoint = receiver(expect, max_payload=chunk)
    pacer = TokenBucket(rate_bytes_per_s=100 * chunk, burst_bytes=chunk)
    with ZmqTransport(send_timeout_s=10) as transport:
        with PrioritySender(transport, KEY, chunk_bytes=chunk, pacer=pacer) as sender:
            sender.submit(endpoint, 1, 1, residual)
            sender.submit(endpoint, 2, 1, residual)
            wait_until(lambda: sender.stats().chunks_sent >= 3)
            sender.submit(endpoint, 3, 0, anchor)
            sender.submit(endpoint, 3, AUX_STREAM, aux)
            result = result_of(child)
    assert result["errors"] == []
    order = [tuple(arrival) for arrival in result["arrivals"]]
    assert len(order) == 96 + 5
    new = [index for index, (room, _, _) in enumerate(order) if room == 3]
    assert new == list(range(new[0], new[0] + 5)), "a residual chunk came between the new request's anchor chunks"
    assert [order[index][1:] for index in new] == [(0, 0), (0, 1), (0, 2), (0, 3), (AUX_STREAM, 0)]
    residual_after = len(order) - new[-1] - 1
    assert residual_after > 0, "the residuals were all sent before the anchor was submitted; nothing was overtaken"
    older = [arrival for arrival in order if arrival[0] != 3]
    assert older == [(1, 1, index) for index in range(48)] + [(2, 1, index) for index in range(48)]


def test_frame_signed_with_another_secret_fails_authentication_at_the_receiver(receiver):
    child, endpoint = receiver({5: {0: 4}}, key=b"receiver-secret", max_frames=1)
    with ZmqTransport(send_timeout_s=10) as transport, PrioritySender(transport, b"sender-secret") as sender:
        sender.submit(endpoint, 5, 0, b"data")
        result = result_of(child)
    assert result["errors"] == ["FrameAuthError"]
    assert result["arrivals"] == []
    assert result["sha256"] == {"5": {}}
