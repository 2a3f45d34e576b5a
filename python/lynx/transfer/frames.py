"""Versioned wire frames: a fixed binary header, a keyed BLAKE2b MAC, and the errors.

One frame is a two-part message ``[header_bytes, payload]``. ``header_bytes``
is ``HEADER_STRUCT`` (network byte order: magic ``b"LYNX"``, version u8,
room u64, stream u8, chunk_index u32, num_chunks u32, offset u64, length u32,
layer_start u16, layer_end u16, segment u16; 40 bytes) followed by a 16-byte
BLAKE2b MAC over those 40 bytes and the payload. With an empty key the MAC is an unkeyed
checksum: it catches corruption, not forgery.
"""

from __future__ import annotations

import hashlib
import hmac
import struct
from dataclasses import dataclass
from typing import TypeVar

from lynx.checks import is_int
from lynx.transfer.keys import root_key
from lynx.transfer.messages import MessageError, decode, wire_of

T = TypeVar("T")

FRAME_VERSION = 2
MAGIC = b"LYNX"
AUX_STREAM = 255
MAX_STAGE_STREAMS = 16
MAC_BYTES = 16
HEADER_STRUCT = struct.Struct("!4sBQBIIQIHHH")
HEADER_BYTES = HEADER_STRUCT.size + MAC_BYTES

_ROOM_START, _ROOM_END = len(MAGIC) + 1, len(MAGIC) + 9
_FRAME_PERSON = b"lynx-frame"
_CONTROL_PERSON = b"lynx-control"
_U16, _U32, _U64 = (1 << 16) - 1, (1 << 32) - 1, (1 << 64) - 1


class FrameError(ValueError):
    """A received frame was rejected; nothing was written anywhere."""


class MalformedFrame(FrameError):
    """Wrong part count, short header, bad magic or inconsistent fields."""


class UnsupportedVersion(FrameError):
    """The header's version is not ``FRAME_VERSION``."""


class OversizedFrame(FrameError):
    """The payload is larger than allowed or than the header says, or falls outside its stream."""


class FrameAuthError(FrameError):
    """The MAC does not match: the frame is corrupt or was signed with another secret."""


class DuplicateFrame(FrameError):
    """A chunk that already arrived arrived again."""


def check_stream(stream: int) -> None:
    """Raise ValueError unless ``stream`` is a codec stage (0..15) or ``AUX_STREAM``."""
    if not is_int(stream) or not (0 <= stream < MAX_STAGE_STREAMS or stream == AUX_STREAM):
        raise ValueError(
            f"stream must be a stage in 0..{MAX_STAGE_STREAMS - 1} or AUX_STREAM={AUX_STREAM}, got {stream!r}"
        )


def priority_of(stream: int) -> int:
    """Priority class of a stream (0 is served first): AUX and stage 0 are class 0, stage s is class s."""
    check_stream(stream)
    return 0 if stream == AUX_STREAM else stream


@dataclass(frozen=True)
class FrameHeader:
    """Where one chunk's payload belongs.

    Attributes:
        room: request id (u64).
        stream: codec stage 0..15, or ``AUX_STREAM`` for request metadata.
        chunk_index: index of this chunk within its stream, ``< num_chunks`` (u32).
        num_chunks: chunks in the whole stream, >= 1 (an empty stream has one
            empty chunk).
        offset: byte offset of this chunk's payload within the stream (u64).
        length: payload bytes (u32).
        layer_start, layer_end: half-open range of model layers whose bytes
            this chunk overlaps (u16 each); ``(0, 0)`` when not known.
        segment: which segment of the request's tokens the stream belongs
            to (u16; see `lynx.kvwire.WireFormat.segments`).
        version: wire format version.
    """

    room: int
    stream: int
    chunk_index: int
    num_chunks: int
    offset: int
    length: int
    layer_start: int
    layer_end: int
    segment: int = 0
    version: int = FRAME_VERSION

    def __post_init__(self) -> None:
        check_stream(self.stream)
        for name, top in (
            ("room", _U64),
            ("chunk_index", _U32),
            ("num_chunks", _U32),
            ("offset", _U64),
            ("length", _U32),
            ("layer_start", _U16),
            ("layer_end", _U16),
            ("segment", _U16),
            ("version", 255),
        ):
            value = getattr(self, name)
            if not is_int(value) or not 0 <= value <= top:
                raise ValueError(f"{name} must be an int in 0..{top}, got {value!r}")
        if self.num_chunks < 1:
            raise ValueError("num_chunks must be >= 1 (an empty stream still has one chunk)")
        if self.chunk_index >= self.num_chunks:
            raise ValueError(f"chunk_index {self.chunk_index} is not below num_chunks {self.num_chunks}")
        if self.layer_start > self.layer_end:
            raise ValueError(f"layer range [{self.layer_start}, {self.layer_end}) is reversed")

    def pack(self) -> bytes:
        """The 40 header-field bytes (without the MAC)."""
        return HEADER_STRUCT.pack(
            MAGIC, self.version, self.room, self.stream, self.chunk_index, self.num_chunks,
            self.offset, self.length, self.layer_start, self.layer_end, self.segment,
        )


def encode_frame(header: FrameHeader, payload: bytes | memoryview, key: bytes) -> list[bytes | memoryview]:
    """The two-part message ``[header_bytes, payload]``; the payload is not copied.

    Raises ValueError if ``len(payload) != header.length``.
    """
    view = memoryview(payload).cast("B") if not isinstance(payload, bytes) else payload
    if len(view) != header.length:
        raise ValueError(f"payload has {len(view)} bytes but header.length is {header.length}")
    fields = header.pack()
    return [fields + _frame_mac(key, fields, view), view]


def decode_frame(parts: list[bytes], key: bytes, max_payload: int) -> tuple[FrameHeader, memoryview]:
    """Validate a received message and return its header and a view of its payload.

    Every other check (part count, magic, version, sizes, header fields) runs
    before the MAC, so junk costs no MAC computation. Nothing raised here is
    known to come from the room's sender (anyone can write any room id into a
    header): a receiver drops a rejected frame, it never fails the room for it.

    Raises:
        MalformedFrame, UnsupportedVersion, OversizedFrame, FrameAuthError.
    """
    if len(parts) != 2:
        raise MalformedFrame(f"a frame has 2 parts (header, payload), got {len(parts)}")
    head, payload = memoryview(parts[0]).cast("B"), memoryview(parts[1]).cast("B")
    if len(head) < len(MAGIC) + 1 or bytes(head[: len(MAGIC)]) != MAGIC:
        raise MalformedFrame(f"bad magic: the header does not start with {MAGIC!r}")
    if head[len(MAGIC)] != FRAME_VERSION:
        raise UnsupportedVersion(
            f"frame version {head[len(MAGIC)]} is not supported (this side speaks {FRAME_VERSION})"
        )
    if len(head) != HEADER_BYTES:
        raise MalformedFrame(f"header has {len(head)} bytes, expected {HEADER_BYTES}")
    fields = bytes(head[: HEADER_STRUCT.size])
    _, version, *values = HEADER_STRUCT.unpack(fields)
    length = values[5]
    if length > max_payload:
        raise OversizedFrame(f"frame declares {length} payload bytes, more than the allowed {max_payload}")
    if len(payload) != length:
        raise OversizedFrame(f"payload has {len(payload)} bytes but the header declares {length}")
    try:
        header = FrameHeader(*values, version=version)
    except ValueError as exc:
        raise MalformedFrame(f"inconsistent header fields: {exc}") from exc
    if not hmac.compare_digest(_frame_mac(key, fields, payload), bytes(head[HEADER_STRUCT.size :])):
        raise FrameAuthError(
            "frame MAC mismatch: the frame was corrupted in transit, or the peer signs with a different shared secret"
        )
    return header, payload


def peek_room(parts: list[bytes]) -> int | None:
    """The room field of a message's header, unverified; None if there is no such field.

    For attributing a rejected frame (e.g. one that failed ``decode_frame``)
    to its request. The value is NOT authenticated: anyone who can reach the
    listener can write any room id here.
    """
    if not parts:
        return None
    head = memoryview(parts[0]).cast("B")
    if len(head) < _ROOM_END or bytes(head[: len(MAGIC)]) != MAGIC:
        return None
    return int.from_bytes(head[_ROOM_START:_ROOM_END], "big")


def seal(key: bytes, parts: list[bytes]) -> list[bytes]:
    """`parts` followed by their MAC (`sign`): how control messages, manifests and alive messages travel."""
    return [*parts, sign(key, *parts)]


def peek(cls: type[T], msg: list[bytes]) -> T | None:
    """The `cls` message (of a fixed part count) a `seal`-ed `msg` carries, its MAC unchecked (`unseal`
    checks it); None if it carries none. Another message costs a count: the part count is compared first."""
    if len(msg) != wire_of(cls).fixed + 1:
        return None
    try:
        return decode(cls, msg[:-1])
    except MessageError:
        return None


def unseal(key: bytes, msg: list[bytes]) -> list[bytes] | None:
    """The parts of a `seal`-ed message without its MAC; None if the MAC does not verify with `key`."""
    if len(msg) < 2 or not verify(key, msg[-1], *msg[:-1]):
        return None
    return msg[:-1]


def sign(key: bytes, *fields: bytes) -> bytes:
    """A 16-byte MAC over length-prefixed ``fields`` (control messages: handshake, registration)."""
    digest = hashlib.blake2b(digest_size=MAC_BYTES, key=root_key(key), person=_CONTROL_PERSON)
    for field in fields:
        digest.update(struct.pack("!Q", len(field)))
        digest.update(field)
    return digest.digest()


def verify(key: bytes, tag: bytes, *fields: bytes) -> bool:
    """Whether ``tag`` is ``sign(key, *fields)``, compared in constant time."""
    return hmac.compare_digest(sign(key, *fields), bytes(tag))


def _frame_mac(key: bytes, fields: bytes, payload: bytes | memoryview) -> bytes:
    digest = hashlib.blake2b(fields, digest_size=MAC_BYTES, key=root_key(key), person=_FRAME_PERSON)
    digest.update(payload)
    return digest.digest()
