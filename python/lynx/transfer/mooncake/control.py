"""The Mooncake transport's endpoint string and its control messages (typed, one serializer).

Bytes move through Mooncake into slots of the listener's registered arena;
everything else goes over one ZeroMQ DEALER (sender) -> ROUTER (listener)
connection per sender and listener:

1. ``Hello(sender_nonce, version)``; the listener answers ``Challenge(listener_nonce,
   tag)`` where the tag proves it holds the shared secret, or ``Reset`` when it
   speaks another ``CONTROL_VERSION``.
2. ``Auth(tag)`` proves the sender holds it; the session is the nonce pair.
3. The listener sends ``Grant(seq, slots)``: slots the sender may write, one
   grant per credit; the sender writes a message's large parts into a granted
   slot, then sends ``Notify(seq, slot, lengths, inline)``; the listener
   grants the slot again once the receiver is done with it. A sender that has
   had nothing to send for a while gives its slots back with
   ``Release(seq, slots)`` and gets none until it sends ``Want(seq)``, so
   idle senders never hold the arena from busy ones.
4. ``Reset(reason)`` ends a session (unsigned: it only ever drops state).
   ``Ping()`` from the listener probes that a sender is still connected
   (ZeroMQ refuses to route to a peer whose connection closed); senders
   ignore it.

Every ``Grant``, ``Notify``, ``Release`` and ``Want`` carries a MAC over the
session nonces, its sequence number and its fields, so messages cannot be
forged without the secret nor replayed into another session or out of order
(a sender's ``Notify``, ``Release`` and ``Want`` share one sequence).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from urllib.parse import parse_qs, urlencode

from lynx.transfer import messages
from lynx.transfer.frames import MAC_BYTES, sign, verify
from lynx.transfer.messages import Const, Family, MessageError, Packed, Parts, Raw, Text, message

CONTROL_VERSION = 2
NONCE_BYTES = 16
INLINE_MAX = 4096
MAX_PARTS = 16
NO_SLOT = (1 << 32) - 1
SCHEME = "mooncake://"
REASON_BYTES = 1024


class ControlError(ValueError):
    """A control message is malformed (wrong kind, sizes or counts)."""


def is_inline(length: int) -> bool:
    """Whether a part of ``length`` bytes travels in the notification instead of the arena."""
    return length <= INLINE_MAX


@dataclass(frozen=True)
class MooncakeEndpoint:
    """What a sender needs to reach a listener; ``str()`` is the endpoint string.

    ``mooncake://SESSION?protocol=P&control=tcp://H:P&arena=0xADDR&slots=N&slot_bytes=N``

    Attributes:
        session: the listener engine's ``host:rpc_port``.
        protocol: ``tcp`` or ``rdma``; both ends must speak the same.
        control: the listener's ZeroMQ control endpoint.
        arena: address of slot 0 in the listener's process.
        slots: number of slots; slot ``i`` starts at ``arena + i * slot_bytes``.
        slot_bytes: bytes per slot: the most a message may put in the arena.
    """

    session: str
    protocol: str
    control: str
    arena: int
    slots: int
    slot_bytes: int

    def __str__(self) -> str:
        query = urlencode({"protocol": self.protocol, "control": self.control, "arena": hex(self.arena),
                           "slots": self.slots, "slot_bytes": self.slot_bytes})
        return f"{SCHEME}{self.session}?{query}"

    def slot_address(self, slot: int) -> int:
        return self.arena + slot * self.slot_bytes

    @classmethod
    def parse(cls, text: str) -> MooncakeEndpoint:
        """Raise ValueError unless ``text`` is a well-formed Mooncake endpoint string."""
        if not isinstance(text, str) or not text.startswith(SCHEME) or "?" not in text:
            raise ValueError(f"not a Mooncake endpoint (expected {SCHEME}host:port?...): {text!r}")
        session, query = text[len(SCHEME):].split("?", 1)
        fields = {name: values[-1] for name, values in parse_qs(query, strict_parsing=True).items()}
        try:
            endpoint = cls(session, fields["protocol"], fields["control"], int(fields["arena"], 16),
                           int(fields["slots"]), int(fields["slot_bytes"]))
        except (KeyError, ValueError) as exc:
            raise ValueError(f"bad Mooncake endpoint {text!r}: {exc}") from exc
        if ":" not in session or not endpoint.control.startswith("tcp://"):
            raise ValueError(f"bad Mooncake endpoint {text!r}: session must be host:port, control tcp://host:port")
        if endpoint.arena <= 0 or endpoint.slots < 1 or endpoint.slot_bytes < 1 or endpoint.slots >= NO_SLOT:
            raise ValueError(f"bad Mooncake endpoint {text!r}: arena, slots and slot_bytes must be positive")
        return endpoint


@message(Const(b"H"), Raw("nonce", NONCE_BYTES), Packed("B", "version"))
@dataclass(frozen=True)
class Hello:
    nonce: bytes
    version: int = CONTROL_VERSION


@message(Const(b"C"), Raw("nonce", NONCE_BYTES), Raw("tag", MAC_BYTES))
@dataclass(frozen=True)
class Challenge:
    nonce: bytes
    tag: bytes


@message(Const(b"A"), Raw("tag", MAC_BYTES))
@dataclass(frozen=True)
class Auth:
    tag: bytes


@message(Const(b"G"), Packed("Q", "seq", array="slots", min_items=1), Raw("tag", MAC_BYTES))
@dataclass(frozen=True)
class Grant:
    seq: int
    slots: tuple[int, ...]
    tag: bytes = b""


def _check_notify(notify: Notify) -> None:
    expected = [length for length in notify.lengths if is_inline(length)]
    if [len(part) for part in notify.inline] != expected:
        raise ValueError("inline parts disagree with the lengths the notification declares")
    if (notify.slot == NO_SLOT) != all(is_inline(length) for length in notify.lengths):
        raise ValueError("a notification names a slot exactly when some part lies in the arena")


@message(Const(b"N"), Packed("QI", "seq", "slot", array="lengths", max_items=MAX_PARTS),
         Parts("inline", MAX_PARTS, INLINE_MAX), Raw("tag", MAC_BYTES), check=_check_notify)
@dataclass(frozen=True)
class Notify:
    """One message: ``lengths`` of all its parts; the inline ones (``is_inline``) in order in ``inline``,
    the others back to back from the start of ``slot`` (``NO_SLOT`` when every part is inline)."""

    seq: int
    slot: int
    lengths: tuple[int, ...]
    inline: tuple[bytes, ...]
    tag: bytes = b""


@message(Const(b"L"), Packed("Q", "seq", array="slots", min_items=1), Raw("tag", MAC_BYTES))
@dataclass(frozen=True)
class Release:
    """The sender gives back ``slots`` granted to it and wants no more until its next ``Want``."""

    seq: int
    slots: tuple[int, ...]
    tag: bytes = b""


@message(Const(b"W"), Packed("Q", "seq"), Raw("tag", MAC_BYTES))
@dataclass(frozen=True)
class Want:
    """The sender has messages to write again: grant it slots."""

    seq: int
    tag: bytes = b""


@message(Const(b"R"), Text("reason", REASON_BYTES, lenient=True))
@dataclass(frozen=True)
class Reset:
    reason: str


@message(Const(b"P"))
@dataclass(frozen=True)
class Ping:
    pass


Message = Hello | Challenge | Auth | Grant | Notify | Release | Want | Reset | Ping
Signed = Grant | Notify | Release | Want
_LABELS = {Grant: b"grant", Notify: b"notify", Release: b"release", Want: b"want"}
_FAMILY = Family(Hello, Challenge, Auth, Grant, Notify, Release, Want, Reset, Ping)


class Session:
    """MACs bound to one session (the shared secret and both nonces)."""

    def __init__(self, key: bytes, sender_nonce: bytes, listener_nonce: bytes) -> None:
        self._key, self._nonces = bytes(key), (bytes(sender_nonce), bytes(listener_nonce))

    def challenge_tag(self) -> bytes:
        """What the listener sends to prove it holds the secret."""
        return sign(self._key, b"challenge", *self._nonces)

    def auth_tag(self) -> bytes:
        """What the sender sends to prove it holds the secret."""
        return sign(self._key, b"auth", *self._nonces)

    def challenge_ok(self, tag: bytes) -> bool:
        return verify(self._key, tag, b"challenge", *self._nonces)

    def auth_ok(self, tag: bytes) -> bool:
        return verify(self._key, tag, b"auth", *self._nonces)

    def sign(self, message: Signed) -> Signed:
        """A copy of ``message`` carrying its MAC."""
        return replace(message, tag=sign(self._key, *self._signed(message)))

    def check(self, message: Signed) -> bool:
        """Whether the message's MAC is right for this session."""
        return verify(self._key, message.tag, *self._signed(message))

    def _signed(self, message: Signed) -> tuple[bytes, ...]:
        return (_LABELS[type(message)], *self._nonces, *encode(message)[1:-1])


def encode(message: Message) -> list[bytes]:
    """The ZeroMQ parts of a control message."""
    return messages.encode(message)


def decode(parts: list[bytes]) -> Message:
    """Parse a control message; raise ControlError if it is malformed (MACs are checked by ``Session``)."""
    if len(parts) == 2 and bytes(parts[0]) == b"H":
        parts = [*parts, bytes([1])]  # the first version's hello carried no version
    try:
        return _FAMILY.decode(parts)
    except MessageError as exc:
        raise ControlError(f"malformed control message: {exc}") from None
