"""The Mooncake transport and listener in one process over `FakeEngine` (no Mooncake engine, real
control sockets on loopback): credits shared by several senders, staging shared by several
endpoints, and links of idle endpoints."""

from __future__ import annotations

import queue
import socket
import threading

import pytest
from mooncake_fakes import use_fake_engine
from pd_fakes import wait_for

from lynx.transfer.mooncake.control import MooncakeEndpoint
from lynx.transfer.mooncake.transport import MooncakeListener, MooncakeTransport

KEY = b"in-process-mooncake-secret-0123"
BIG = b"x" * 10_000  # goes through the arena (over INLINE_MAX)


class Drain:
    """Calls ``listener.recv`` on a thread (handshakes and credits need it) and queues what arrives."""

    def __init__(self, listener):
        self.listener, self.messages, self._stop = listener, queue.Queue(), threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        while not self._stop.is_set():
            parts = self.listener.recv(0.01)
            if parts is not None:
                self.messages.put([bytes(part) for part in parts])

    def taken(self, count, timeout_s=5.0):
        got = []
        wait_for(lambda: (got.extend(_pop_all(self.messages)), len(got) >= count)[1], timeout_s)
        return got

    def stop(self):
        self._stop.set()
        self._thread.join()


def _pop_all(messages):
    out = []
    while not messages.empty():
        out.append(messages.get_nowait())
    return out


@pytest.fixture
def fake_engine(monkeypatch):
    use_fake_engine(monkeypatch)


class Clock:
    now = 1000.0

    def __call__(self):
        return self.now


def test_a_third_sender_gets_credit_from_two_idle_ones(fake_engine):
    """16 slots, 8 per sender at most: two senders that went idle give theirs back."""
    with MooncakeListener(KEY, slots=16, slots_per_peer=8) as listener:
        drain = Drain(listener)
        senders = [MooncakeTransport(KEY, send_timeout_s=3) for _ in range(3)]
        try:
            for index, sender in enumerate(senders[:2]):
                sender.send(listener.endpoint, [bytes([index]), BIG])
            assert len(drain.taken(2)) == 2
            senders[2].send(listener.endpoint, [b"\x02", BIG])
            assert drain.taken(1, timeout_s=5.0) == [[b"\x02", BIG]], "the third sender never got a slot"
        finally:
            for sender in senders:
                sender.close()
            drain.stop()


def _dead_endpoint() -> str:
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return str(MooncakeEndpoint("127.0.0.1:1", "tcp", f"tcp://127.0.0.1:{port}", 1 << 20, 16, 1 << 20))


def test_a_dead_endpoint_holds_only_its_share_of_staging_and_a_healthy_one_is_served_at_once(fake_engine):
    with MooncakeListener(KEY) as listener, MooncakeTransport(KEY, send_timeout_s=1) as transport:
        drain = Drain(listener)
        try:
            dead = _dead_endpoint()
            held = 0
            while held < 8 and transport.ready(dead):
                transport.send(dead, [b"lost", BIG])
                held += 1
            assert transport.ready(listener.endpoint), f"messages to a dead endpoint hold all staging ({held})"
            transport.send(listener.endpoint, [b"ok", BIG])
            assert drain.taken(1) == [[b"ok", BIG]]
        finally:
            drain.stop()


def test_a_link_idle_for_long_is_closed_and_a_later_send_opens_a_new_one(fake_engine):
    clock = Clock()
    with MooncakeListener(KEY) as a, MooncakeListener(KEY) as b:
        drains = Drain(a), Drain(b)
        try:
            with MooncakeTransport(KEY, send_timeout_s=5, idle_close_s=300, clock=clock) as transport:
                transport.send(a.endpoint, [b"1", BIG])
                assert drains[0].taken(1) == [[b"1", BIG]]
                link = transport._links[a.endpoint]
                clock.now += 301
                transport.send(b.endpoint, [b"2", BIG])
                assert transport.endpoints == (b.endpoint,) and link.finished
                transport.send(a.endpoint, [b"3", BIG])
                assert drains[0].taken(1) == [[b"3", BIG]] and drains[1].taken(1) == [[b"2", BIG]]
                assert sorted(transport.endpoints) == sorted((a.endpoint, b.endpoint))
        finally:
            for drain in drains:
                drain.stop()


def test_a_sender_of_another_control_version_is_told_why_it_is_refused(fake_engine):
    import zmq

    from lynx.transfer.mooncake.control import Reset, decode

    with MooncakeListener(b"") as listener:
        drain = Drain(listener)
        context = zmq.Context()
        dealer = context.socket(zmq.DEALER)
        try:
            dealer.connect(MooncakeEndpoint.parse(listener.endpoint).control)
            dealer.send_multipart([b"H", b"n" * 16])  # the first version's hello carried no version
            assert dealer.poll(5000)
            reply = decode(dealer.recv_multipart())
            assert isinstance(reply, Reset) and "control v1" in reply.reason and "v2" in reply.reason
        finally:
            dealer.close(linger=0)
            context.term()
            drain.stop()
