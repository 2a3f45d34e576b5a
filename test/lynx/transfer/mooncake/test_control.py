"""The Mooncake transport's endpoint string and control messages, without sockets or the engine."""

import pytest

from lynx.transfer.mooncake.control import (
    CONTROL_VERSION,
    INLINE_MAX,
    MAX_PARTS,
    NO_SLOT,
    Auth,
    Challenge,
    ControlError,
    Grant,
    Hello,
    MooncakeEndpoint,
    Notify,
    Ping,
    Release,
    Reset,
    Session,
    Want,
    decode,
    encode,
)

KEY = b"control-secret"
NONCES = (b"s" * 16, b"l" * 16)


def test_endpoint_string_round_trips():
    endpoint = MooncakeEndpoint("127.0.0.1:15001", "tcp", "tcp://127.0.0.1:5555", 0x7F00DEAD0000, 16, 4 << 20)
    assert MooncakeEndpoint.parse(str(endpoint)) == endpoint
    assert endpoint.slot_address(3) == 0x7F00DEAD0000 + 3 * (4 << 20)


@pytest.mark.parametrize("text", [
    "tcp://127.0.0.1:5555",
    "mooncake://127.0.0.1:1",
    "mooncake://127.0.0.1:1?protocol=tcp&control=tcp://h:1&arena=0x10&slots=1",
    "mooncake://127.0.0.1:1?protocol=tcp&control=tcp://h:1&arena=zz&slots=1&slot_bytes=1",
    "mooncake://127.0.0.1:1?protocol=tcp&control=tcp://h:1&arena=0x10&slots=0&slot_bytes=1",
    "mooncake://nohost?protocol=tcp&control=tcp://h:1&arena=0x10&slots=1&slot_bytes=1",
    "mooncake://127.0.0.1:1?protocol=tcp&control=ipc://x&arena=0x10&slots=1&slot_bytes=1",
])
def test_malformed_endpoint_strings_are_refused(text):
    with pytest.raises(ValueError):
        MooncakeEndpoint.parse(text)


@pytest.mark.parametrize("message", [
    Hello(b"n" * 16),
    Hello(b"n" * 16, version=7),
    Challenge(b"n" * 16, b"t" * 16),
    Auth(b"t" * 16),
    Grant(3, (0, 5, 7), b"t" * 16),
    Notify(9, 2, (38, 50_000, 12), (b"h" * 38, b"x" * 12), b"t" * 16),
    Notify(0, NO_SLOT, (0, INLINE_MAX), (b"", b"y" * INLINE_MAX), b"t" * 16),
    Release(10, (4, 0), b"t" * 16),
    Want(11, b"t" * 16),
    Reset("gone"),
    Ping(),
])
def test_messages_round_trip(message):
    assert decode(encode(message)) == message


@pytest.mark.parametrize("parts", [
    [],
    [b"H", b"short"],
    [b"H", b"n" * 16, b"22"],
    [b"L", encode(Release(0, (1,)))[1][:-4], b"t" * 16],
    [b"W", b"\0" * 7, b"t" * 16],
    [b"X", b"n" * 16],
    [b"G", b"\0" * 10, b"t" * 16],
    [b"G", encode(Grant(0, (1, 2)))[1][:-4], b"t" * 16],
    encode(Notify(0, 1, (50_000, 5), (b"wrong",), b"t" * 16))[:2] + [b"toolong", b"t" * 16],
    encode(Notify(0, 1, (5,), (b"12345",), b"t" * 16)),
    encode(Notify(0, NO_SLOT, (50_000,), (), b"t" * 16)),
    encode(Notify(0, 0, (1,) * (MAX_PARTS + 1), (b"x",) * (MAX_PARTS + 1), b"t" * 16)),
])
def test_malformed_messages_are_refused(parts):
    with pytest.raises(ControlError):
        decode(parts)


def test_signed_messages_check_only_in_their_own_session_and_unchanged():
    session = Session(KEY, *NONCES)
    grant = session.sign(Grant(4, (1, 2)))
    notify = session.sign(Notify(7, 1, (50_000,), ()))
    assert session.check(grant) and session.check(notify)
    assert not Session(KEY, NONCES[0], b"m" * 16).check(notify), "replayed into another session"
    assert not Session(b"other", *NONCES).check(notify), "forged without the secret"
    assert not session.check(Notify(8, 1, (50_000,), (), notify.tag)), "sequence number changed"
    assert not session.check(Notify(7, 0, (50_000,), (), notify.tag)), "slot changed"
    assert not session.check(Grant(4, (1, 3), grant.tag)), "granted slots changed"
    assert not session.check(Grant(7, (1,), notify.tag)), "a notification's MAC passed as a grant's"
    release, want = session.sign(Release(5, (1, 2))), session.sign(Want(6))
    assert session.check(release) and session.check(want)
    assert not session.check(Grant(5, (1, 2), release.tag)), "a release's MAC passed as a grant's"
    assert not session.check(Release(5, (1,), release.tag)), "released slots changed"
    assert not session.check(Want(7, want.tag)), "sequence number changed"


def test_a_hello_of_the_first_version_carried_no_version_and_reads_as_version_1():
    assert decode([b"H", b"n" * 16]) == Hello(b"n" * 16, version=1)
    assert encode(Hello(b"n" * 16)) == [b"H", b"n" * 16, bytes([CONTROL_VERSION])]


def test_handshake_tags_prove_the_secret_each_way():
    listener, sender, stranger = Session(KEY, *NONCES), Session(KEY, *NONCES), Session(b"guess", *NONCES)
    assert sender.challenge_ok(listener.challenge_tag())
    assert listener.auth_ok(sender.auth_tag())
    assert not listener.auth_ok(stranger.auth_tag())
    assert not sender.challenge_ok(stranger.challenge_tag())
    assert not listener.auth_ok(listener.challenge_tag()), "a challenge tag replayed as the answer"
