"""The part codecs of `lynx.transfer.messages`: how one or a few fields of a message become wire parts.

Each codec encodes fields read from a message into its parts and decodes its
parts into checked field values (type, size, range), raising `MessageError`
naming the field. A leaf: of `lynx` it imports only `lynx.checks`.
"""

from __future__ import annotations

import dataclasses
import re
import struct
import typing

from lynx.checks import is_int

U64_MAX = (1 << 64) - 1
_DECIMAL = re.compile(rb"-?[0-9]{1,20}")


class MessageError(ValueError):
    """Parts that are not a well-formed message of the expected type, or a message the wire cannot carry."""


class Part:
    """How some fields of a message travel: ``width`` wire parts (None: any number), carrying ``names``."""

    names: tuple[str, ...] = ()
    width: int | None = 1

    def bind(self, cls: type) -> Part:
        """This codec as used by message type `cls` (the default needs nothing of it)."""
        return self

    def encode(self, message: object) -> list[bytes]:
        return [self.pack(*(getattr(message, name) for name in self.names))]

    def decode(self, chunks: list[bytes]) -> dict[str, object]:
        return dict(zip(self.names, self.unpack(chunks[0])))

    def pack(self, *values: object) -> bytes:
        raise NotImplementedError

    def unpack(self, data: bytes) -> tuple:
        raise NotImplementedError


class Const(Part):
    def __init__(self, value: bytes) -> None:
        self.value = value

    def pack(self) -> bytes:
        return self.value

    def unpack(self, data: bytes) -> tuple:
        if data != self.value:
            raise MessageError(f"kind {data[:16]!r}, expected {self.value!r}")
        return ()


class Text(Part):
    """UTF-8 text. ``lenient``: encode cuts at ``max_bytes`` and decode replaces bad bytes (a reason)."""

    def __init__(self, name: str, max_bytes: int = 1024, lenient: bool = False) -> None:
        self.names, self.max_bytes, self.lenient = (name,), max_bytes, lenient

    def pack(self, value: object) -> bytes:
        if not isinstance(value, str):
            raise MessageError(f"{self.names[0]}: expected str, got {value!r}")
        return value.encode()[: self.max_bytes] if self.lenient else value.encode()

    def unpack(self, data: bytes) -> tuple:
        if len(data) > self.max_bytes:
            raise MessageError(f"{self.names[0]}: {len(data)} bytes, at most {self.max_bytes}")
        try:
            return (data.decode(errors="replace" if self.lenient else "strict"),)
        except UnicodeDecodeError as exc:
            raise MessageError(f"{self.names[0]}: not UTF-8 ({exc.reason})") from None


def _parse_int(name: str, data: bytes, lo: int, hi: int) -> int:
    if not _DECIMAL.fullmatch(data):
        raise MessageError(f"{name}: {data[:24]!r} is not a decimal int")
    value = int(data)
    if not lo <= value <= hi:
        raise MessageError(f"{name}: {value} is not in {lo}..{hi}")
    return value


class Decimal(Part):
    def __init__(self, name: str, lo: int = 0, hi: int = U64_MAX) -> None:
        self.names, self.lo, self.hi = (name,), lo, hi

    def pack(self, value: object) -> bytes:
        if not is_int(value):
            raise MessageError(f"{self.names[0]}: expected int, got {value!r}")
        return str(value).encode()

    def unpack(self, data: bytes) -> tuple:
        return (_parse_int(self.names[0], data, self.lo, self.hi),)


class Flag(Part):
    def __init__(self, name: str) -> None:
        self.names = (name,)

    def pack(self, value: object) -> bytes:
        if not isinstance(value, bool):
            raise MessageError(f"{self.names[0]}: expected bool, got {value!r}")
        return b"1" if value else b"0"

    def unpack(self, data: bytes) -> tuple:
        if data not in (b"0", b"1"):
            raise MessageError(f"{self.names[0]}: {data[:8]!r} is not 0 or 1")
        return (data == b"1",)


class Raw(Part):
    """Bytes of exactly ``size`` on decode (encode writes what the field holds: a message may be signed later)."""

    def __init__(self, name: str, size: int) -> None:
        self.names, self.size = (name,), size

    def pack(self, value: object) -> bytes:
        if not isinstance(value, (bytes, bytearray)):
            raise MessageError(f"{self.names[0]}: expected bytes, got {type(value).__name__}")
        return bytes(value)

    def unpack(self, data: bytes) -> tuple:
        if len(data) != self.size:
            raise MessageError(f"{self.names[0]}: {len(data)} bytes, expected {self.size}")
        return (data,)


class Body(Raw):
    """One bytes part of any length up to ``max_bytes``: a body that another codec parses (a manifest's)."""

    def __init__(self, name: str, max_bytes: int) -> None:
        self.names, self.max_bytes = (name,), max_bytes

    def unpack(self, data: bytes) -> tuple:
        if len(data) > self.max_bytes:
            raise MessageError(f"{self.names[0]}: {len(data)} bytes, at most {self.max_bytes}")
        return (data,)


class Decimals(Part):
    """Ints joined by commas: a ``tuple[int, ...]`` of at most ``max_count``, or one ``record`` (its fields in
    order, bools as 0 or 1)."""

    def __init__(self, name: str, max_count: int = 64, record: type | None = None) -> None:
        self.names, self.max_count, self.record = (name,), max_count, record
        self._bools: tuple[bool, ...] = ()
        if record is not None:
            hints = typing.get_type_hints(record)
            self._bools = tuple(hints[f.name] is bool for f in dataclasses.fields(record))
            self.max_count = len(self._bools)

    def pack(self, value: object) -> bytes:
        if self.record is not None:
            if not isinstance(value, self.record):
                raise MessageError(f"{self.names[0]}: expected {self.record.__name__}, got {value!r}")
            value = tuple(int(v) for v in dataclasses.astuple(value))
        if not isinstance(value, tuple) or not all(is_int(v) for v in value):
            raise MessageError(f"{self.names[0]}: expected a tuple of ints, got {value!r}")
        return ",".join(map(str, value)).encode()

    def unpack(self, data: bytes) -> tuple:
        name = self.names[0]
        if data.count(b",") >= self.max_count or len(data) > 21 * self.max_count:
            raise MessageError(f"{name}: more than {self.max_count} ints, or over {21 * self.max_count} bytes")
        values = tuple(_parse_int(name, item, 0, U64_MAX) for item in data.split(b",")) if data else ()
        if self.record is None:
            return (values,)
        if len(values) != len(self._bools):
            raise MessageError(f"{name}: {len(values)} ints, expected {len(self._bools)}")
        if any(flag and v not in (0, 1) for flag, v in zip(self._bools, values)):
            raise MessageError(f"{name}: a flag is not 0 or 1")
        try:
            return (self.record(*(bool(v) if flag else v for flag, v in zip(self._bools, values))),)
        except (ValueError, TypeError) as exc:
            raise MessageError(f"{name}: {exc}") from None


class Packed(Part):
    """Struct fields in network byte order (``fmt`` without the ``!``); with ``array``, then a u16 count
    and that many u32 (``min_items..max_items``)."""

    def __init__(self, fmt: str, *names: str, array: str | None = None, min_items: int = 0,
                 max_items: int = 0xFFFF) -> None:
        self.names, self.array = names + ((array,) if array else ()), array
        self.head = struct.Struct("!" + fmt + ("H" if array else ""))
        self.min_items, self.max_items = min_items, max_items

    def pack(self, *values: object) -> bytes:
        items = values[-1] if self.array else ()
        fixed = values[:-1] if self.array else values
        if not all(is_int(v) for v in (*fixed, *items)):
            raise MessageError(f"{', '.join(self.names)}: expected ints, got {values!r}")
        try:
            count = (len(items),) if self.array else ()
            return self.head.pack(*fixed, *count) + struct.pack(f"!{len(items)}I", *items)
        except struct.error as exc:
            raise MessageError(f"{', '.join(self.names)}: {exc}") from None

    def unpack(self, data: bytes) -> tuple:
        what = ", ".join(self.names)
        if len(data) < self.head.size:
            raise MessageError(f"{what}: truncated to {len(data)} bytes, at least {self.head.size}")
        values = self.head.unpack_from(data)
        if not self.array:
            if len(data) != self.head.size:
                raise MessageError(f"{what}: {len(data)} bytes, expected {self.head.size}")
            return values
        count = values[-1]
        if not self.min_items <= count <= self.max_items or len(data) != self.head.size + 4 * count:
            raise MessageError(f"{what}: {count} items (allowed {self.min_items}..{self.max_items}) "
                               f"in {len(data)} bytes")
        return (*values[:-1], struct.unpack_from(f"!{count}I", data, self.head.size))


class Parts(Part):
    """A run of raw parts, at most ``max_count`` of at most ``max_bytes`` each."""

    width = None

    def __init__(self, name: str, max_count: int, max_bytes: int) -> None:
        self.names, self.max_count, self.max_bytes = (name,), max_count, max_bytes

    def encode(self, message: object) -> list[bytes]:
        value = getattr(message, self.names[0])
        if not isinstance(value, tuple) or not all(isinstance(v, (bytes, bytearray)) for v in value):
            raise MessageError(f"{self.names[0]}: expected a tuple of bytes, got {type(value).__name__}")
        return [bytes(v) for v in value]

    def decode(self, chunks: list[bytes]) -> dict[str, object]:
        if len(chunks) > self.max_count or any(len(chunk) > self.max_bytes for chunk in chunks):
            raise MessageError(f"{self.names[0]}: {len(chunks)} parts (at most {self.max_count}) "
                               f"or one over {self.max_bytes} bytes")
        return {self.names[0]: tuple(chunks)}
