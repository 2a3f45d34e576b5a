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

import struct
from dataclasses import dataclass, replace
from urllib.parse import parse_qs, urlencode

from lynx.transfer.frames import MAC_BYTES, sign, verify

CONTROL_VERSION = 2
NONCE_BYTES = 16
INLINE_MAX = 4096
MAX_PARTS = 16
NO_SLOT = (1 << 32) - 1
SCHEME = "mooncake://"

_GRANT = struct.Struct("!QH")  # also a Release: seq, slot count, then the slots
_NOTIFY = struct.Struct("!QIH")
_WANT = struct.Struct("!Q")


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


@dataclass(frozen=True)
class Hello:
    nonce: bytes
    version: int = CONTROL_VERSION


@dataclass(frozen=True)
class Challenge:
    nonce: bytes
    tag: bytes


@dataclass(frozen=True)
class Auth:
    tag: bytes


@dataclass(frozen=True)
class Grant:
    seq: int
    slots: tuple[int, ...]
    tag: bytes = b""


@dataclass(frozen=True)
class Notify:
    """One message: ``lengths`` of all its parts; the inline ones (``is_inline``) in order in ``inline``,
    the others back to back from the start of ``slot`` (``NO_SLOT`` when every part is inline)."""

    seq: int
    slot: int
    lengths: tuple[int, ...]
    inline: tuple[bytes, ...]
    tag: bytes = b""


@dataclass(frozen=True)
class Release:
    """The sender gives back ``slots`` granted to it and wants no more until its next ``Want``."""

    seq: int
    slots: tuple[int, ...]
    tag: bytes = b""


@dataclass(frozen=True)
class Want:
    """The sender has messages to write again: grant it slots."""

    seq: int
    tag: bytes = b""


@dataclass(frozen=True)
class Reset:
    reason: str


@dataclass(frozen=True)
class Ping:
    pass


Message = Hello | Challenge | Auth | Grant | Notify | Release | Want | Reset | Ping
Signed = Grant | Notify | Release | Want
_LABELS = {Grant: b"grant", Notify: b"notify", Release: b"release", Want: b"want"}
_KINDS = {Grant: b"G", Notify: b"N", Release: b"L", Want: b"W"}


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
        return (_LABELS[type(message)], *self._nonces, *_fields(message)[:-1])


def encode(message: Message) -> list[bytes]:
    """The ZeroMQ parts of a control message."""
    if isinstance(message, Hello):
        return [b"H", message.nonce, bytes([message.version])]
    if isinstance(message, Challenge):
        return [b"C", message.nonce, message.tag]
    if isinstance(message, Auth):
        return [b"A", message.tag]
    if isinstance(message, Reset):
        return [b"R", message.reason.encode()[:1024]]
    if isinstance(message, Ping):
        return [b"P"]
    return [_KINDS[type(message)], *_fields(message)]


def decode(parts: list[bytes]) -> Message:
    """Parse a control message; raise ControlError if it is malformed (MACs are checked by ``Session``)."""
    if not parts:
        raise ControlError("empty control message")
    kind, rest = bytes(parts[0]), [bytes(part) for part in parts[1:]]
    try:
        if kind == b"H" and len(rest) in (1, 2) and len(rest[0]) == NONCE_BYTES:
            if len(rest) == 2 and len(rest[1]) != 1:
                raise ControlError("a hello's version is one byte")
            return Hello(rest[0], rest[1][0] if len(rest) == 2 else 1)  # version 1 sent none
        if kind == b"C" and len(rest) == 2 and len(rest[0]) == NONCE_BYTES and len(rest[1]) == MAC_BYTES:
            return Challenge(rest[0], rest[1])
        if kind == b"A" and len(rest) == 1 and len(rest[0]) == MAC_BYTES:
            return Auth(rest[0])
        if kind == b"R" and len(rest) == 1:
            return Reset(rest[0].decode(errors="replace"))
        if kind == b"P" and not rest:
            return Ping()
        if kind in (b"G", b"L") and len(rest) == 2 and len(rest[1]) == MAC_BYTES:
            seq, count = _GRANT.unpack_from(rest[0])
            if count == 0 or len(rest[0]) != _GRANT.size + 4 * count:
                raise ControlError("a grant or release names no slot, or its size disagrees with its slot count")
            slots = struct.unpack_from(f"!{count}I", rest[0], _GRANT.size)
            return (Grant if kind == b"G" else Release)(seq, slots, rest[1])
        if kind == b"W" and len(rest) == 2 and len(rest[0]) == _WANT.size and len(rest[1]) == MAC_BYTES:
            return Want(_WANT.unpack(rest[0])[0], rest[1])
        if kind == b"N" and len(rest) >= 2 and len(rest[-1]) == MAC_BYTES:
            return _decode_notify(rest[0], rest[1:-1], rest[-1])
    except struct.error as exc:
        raise ControlError(f"truncated control message: {exc}") from exc
    raise ControlError(f"malformed control message of kind {kind[:8]!r} with {len(rest)} more parts")


def _decode_notify(head: bytes, inline: list[bytes], tag: bytes) -> Notify:
    seq, slot, count = _NOTIFY.unpack_from(head)
    if count > MAX_PARTS or len(head) != _NOTIFY.size + 4 * count:
        raise ControlError(f"notification with {count} parts (at most {MAX_PARTS}) or a wrong size")
    lengths = struct.unpack_from(f"!{count}I", head, _NOTIFY.size)
    expected = [length for length in lengths if is_inline(length)]
    if [len(part) for part in inline] != expected:
        raise ControlError("inline parts disagree with the lengths the notification declares")
    if (slot == NO_SLOT) != all(is_inline(length) for length in lengths):
        raise ControlError("a notification names a slot exactly when some part lies in the arena")
    return Notify(seq, slot, lengths, tuple(inline), tag)


def _fields(message: Signed) -> list[bytes]:
    """The parts after the kind: packed fields, inline parts, then the tag."""
    if isinstance(message, (Grant, Release)):
        return [_GRANT.pack(message.seq, len(message.slots)) + struct.pack(f"!{len(message.slots)}I", *message.slots),
                message.tag]
    if isinstance(message, Want):
        return [_WANT.pack(message.seq), message.tag]
    head = _NOTIFY.pack(message.seq, message.slot, len(message.lengths))
    return [head + struct.pack(f"!{len(message.lengths)}I", *message.lengths), *message.inline, message.tag]
