"""The transports `select` builds: CurveZMQ whenever a secret is set, plaintext only when asked for."""

import pytest

from lynx.config import LynxConfig
from lynx.transfer.keys import curve_keys
from lynx.transfer.select import make_listener, make_transport
from lynx.transfer.transport import TransportError
from lynx.transfer.zmq_transport import ZmqTransport

SECRET = b"select-test-secret-0123456789abc"


def delivered(transport, listener) -> bool:
    """Whether one message from ``transport`` reaches ``listener``."""
    transport.send(listener.endpoint, [b"hello"])
    return listener.recv(10.0) == [b"hello"]


def refused(transport, listener) -> bool:
    """Whether ``listener`` never gets a message from ``transport`` (its handshake is refused)."""
    try:
        transport.send(listener.endpoint, [b"junk"] * 6000)
    except TransportError:
        return listener.recv(0.2) is None
    return False


def test_with_a_secret_both_ends_speak_curvezmq_and_a_plaintext_peer_is_refused():
    config = LynxConfig()
    with make_listener(config, SECRET, "127.0.0.1") as listener, make_transport(config, SECRET, "127.0.0.1") as ours:
        assert delivered(ours, listener)
        with ZmqTransport(send_timeout_s=0.5) as plain:
            assert refused(plain, listener)
        with ZmqTransport(send_timeout_s=0.5, curve=curve_keys(b"another-secret-0123456789abcdef")) as other:
            assert refused(other, listener)


@pytest.mark.parametrize("secret", [SECRET, b""], ids=["plaintext-data", "insecure"])
def test_plaintext_only_with_plaintext_data_or_without_a_secret(secret):
    config = LynxConfig(plaintext_data=bool(secret), insecure=not secret)
    with make_listener(config, secret, "127.0.0.1") as listener, make_transport(config, secret, "127.0.0.1") as ours:
        assert delivered(ours, listener)
        with ZmqTransport(send_timeout_s=5) as plain:
            assert delivered(plain, listener)
