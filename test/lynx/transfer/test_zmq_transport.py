"""ZeroMQ transport and listener over TCP on 127.0.0.1: delivery, size bound, dead peers, closing."""

import threading

import pytest

from lynx.transfer.sender import PrioritySender
from lynx.transfer.transport import TransportError
from lynx.transfer.zmq_transport import ZmqListener, ZmqTransport


def receive(listener, timeout_s=10.0):
    """The next message, waiting up to ``timeout_s``."""
    return listener.recv(timeout_s)


def dead_endpoint():
    """An endpoint nobody listens on (a listener's port, released)."""
    listener = ZmqListener(max_message_bytes=16)
    endpoint = listener.endpoint
    listener.close()
    return endpoint


def test_multipart_messages_arrive_in_order_at_the_reported_endpoint():
    with ZmqListener(max_message_bytes=1 << 20) as listener, ZmqTransport(send_timeout_s=10) as transport:
        assert listener.endpoint.startswith("tcp://127.0.0.1:")
        assert not listener.endpoint.endswith(":0")
        payload = bytearray(range(256)) * 1024
        transport.send(listener.endpoint, [b"head-1", memoryview(payload)])
        transport.send(listener.endpoint, [b"head-2", b""])
        assert receive(listener) == [b"head-1", bytes(payload)]
        assert receive(listener) == [b"head-2", b""]
        assert listener.recv(0.05) is None


def test_sends_from_several_threads_all_arrive():
    with ZmqListener(max_message_bytes=64) as listener, ZmqTransport(send_timeout_s=10) as transport:

        def send_many(tag):
            for index in range(50):
                transport.send(listener.endpoint, [tag, str(index).encode()])

        threads = [threading.Thread(target=send_many, args=(tag,)) for tag in (b"a", b"b", b"c")]
        for thread in threads:
            thread.start()
        received = [receive(listener) for _ in range(150)]
        for thread in threads:
            thread.join(10)
        for tag in (b"a", b"b", b"c"):
            assert [int(parts[1]) for parts in received if parts[0] == tag] == list(range(50))


def test_listener_refuses_a_message_part_over_its_size_bound_and_keeps_serving():
    with ZmqListener(max_message_bytes=1024) as listener, ZmqTransport(send_timeout_s=10) as transport:
        transport.send(listener.endpoint, [b"head", b"x" * 4096])
        assert listener.recv(1.0) is None
        for _ in range(100):
            transport.send(listener.endpoint, [b"head", b"small"])
            parts = listener.recv(0.1)
            if parts is not None:
                break
        assert parts == [b"head", b"small"]


def test_send_to_a_dead_endpoint_raises_transport_error_naming_it():
    endpoint = dead_endpoint()
    with ZmqTransport(send_timeout_s=0.3) as transport:
        with pytest.raises(TransportError, match=endpoint.replace(".", r"\.")):
            transport.send(endpoint, [b"head", b"payload"])


def test_sender_reports_a_dead_endpoint_through_on_error_for_the_room():
    endpoint = dead_endpoint()
    failed = threading.Event()
    errors = []

    def on_error(room, message):
        errors.append((room, message))
        failed.set()

    with ZmqTransport(send_timeout_s=0.3) as transport:
        with PrioritySender(transport, b"key", chunk_bytes=4, on_error=on_error, stall_timeout_s=0.3) as sender:
            sender.submit(endpoint, 77, 0, b"x" * 16)
            assert failed.wait(30)
            assert sender.wait_idle(timeout_s=30)
    assert errors == [(77, errors[0][1])]
    assert endpoint in errors[0][1]


def test_malformed_endpoint_is_a_transport_error():
    with ZmqTransport() as transport:
        with pytest.raises(TransportError, match="cannot connect"):
            transport.send("not-an-endpoint", [b"x"])


def test_close_is_idempotent_and_later_use_is_refused():
    transport = ZmqTransport()
    listener = ZmqListener(max_message_bytes=16)
    transport.send(listener.endpoint, [b"x"])
    transport.close()
    transport.close()
    listener.close()
    listener.close()
    with pytest.raises(TransportError, match="closed"):
        transport.send(listener.endpoint, [b"x"])
    with pytest.raises(TransportError, match="closed"):
        listener.recv(0.01)


def test_port_in_use_is_a_transport_error():
    with ZmqListener(max_message_bytes=16) as listener:
        port = int(listener.endpoint.rsplit(":", 1)[1])
        with pytest.raises(TransportError, match="cannot listen"):
            ZmqListener(port=port, max_message_bytes=16)


class Clock:
    now = 1000.0

    def __call__(self):
        return self.now


def test_a_socket_idle_for_long_is_closed_and_a_later_send_opens_a_new_one():
    clock = Clock()
    with ZmqListener(max_message_bytes=64) as a, ZmqListener(max_message_bytes=64) as b:
        with ZmqTransport(send_timeout_s=10, idle_close_s=300, clock=clock) as transport:
            transport.send(a.endpoint, [b"1"])
            assert receive(a) == [b"1"]
            clock.now += 299
            transport.send(b.endpoint, [b"2"])
            assert sorted(transport.endpoints) == sorted((a.endpoint, b.endpoint)), "closed before its time"
            clock.now += 2
            transport.send(b.endpoint, [b"3"])
            assert transport.endpoints == (b.endpoint,)
            transport.send(a.endpoint, [b"4"])
            assert receive(a) == [b"4"] and receive(b) == [b"2"] and receive(b) == [b"3"]


@pytest.mark.parametrize("kwargs", [dict(send_timeout_s=0), dict(high_water_mark=0), dict(idle_close_s=10)])
def test_invalid_transport_settings_are_value_errors(kwargs):
    with pytest.raises(ValueError):
        ZmqTransport(**kwargs)


@pytest.mark.parametrize("kwargs", [dict(max_message_bytes=0), dict(max_message_bytes=8, port=70000)])
def test_invalid_listener_settings_are_value_errors(kwargs):
    with pytest.raises(ValueError):
        ZmqListener(**kwargs)
