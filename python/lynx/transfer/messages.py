"""The one codec of Lynx's typed messages: a frozen dataclass to and from its wire parts, field by field.

A message type states how it travels with the `message` class decorator: its
parts in wire order, each a part codec naming the dataclass fields it carries
(every field exactly once). `encode` and `decode` are then its only
serializer; `Family` decodes whichever of several types a kind tag names. The
pd control messages (`lynx.pd.control`), the Mooncake control messages
(`lynx.transfer.mooncake.control`), the manifest and its envelope (`lynx.manifest`) and the
alive message (`lynx.transfer.alive`) use it.

Part codecs (`message_parts`, `message_json`; one wire part each, except `Parts`):

* ``Const(b"G")``: a fixed part (a kind tag), no field.
* ``Text(f)``: UTF-8, at most ``max_bytes``.
* ``Decimal(f)``: an ASCII decimal int in ``lo..hi``.
* ``Flag(f)``: a bool as ``b"1"`` or ``b"0"``.
* ``Raw(f, size)``: bytes of exactly ``size`` (a nonce, a MAC).
* ``Body(f, max_bytes)``: bytes of any length up to ``max_bytes`` (a body
  another codec parses).
* ``Decimals(f)``: ints joined by commas: a ``tuple[int, ...]``, or a
  ``record`` dataclass of int and bool fields.
* ``Packed(fmt, f, ...)``: big-endian struct fields, then optionally a counted
  array of u32 (``array``).
* ``Parts(f)``: a variable run of raw parts (at most one per message).
* ``Json()``: every field as one JSON object, keys sorted; bounded in bytes
  and in nesting depth, which is measured without recursion before parsing.

`encode` checks types and what the wire cannot represent; `decode` checks part
counts, sizes, every value's type and range, then builds the dataclass (its
``__post_init__`` and the type's ``check`` run too) and raises `MessageError`,
a ValueError naming the message and the field. MACs are not this module's
business: `lynx.transfer.frames` seals and opens the parts, and the Mooncake
``Session`` signs the encoded fields.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import TypeVar

from lynx.transfer.message_json import Json, json_depth
from lynx.transfer.message_parts import (
    Body,
    Const,
    Decimal,
    Decimals,
    Flag,
    MessageError,
    Packed,
    Part,
    Parts,
    Raw,
    Text,
)

__all__ = ["Body", "Const", "Decimal", "Decimals", "Family", "Flag", "Json", "MessageError", "Packed", "Part", "Parts",
           "Raw", "Text", "Wire", "decode", "encode", "json_depth", "message"]

T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class Wire:
    """How one message type travels: its bound part codecs in order, and a check of the whole message."""

    parts: tuple[Part, ...]
    check: Callable[[object], None] | None = None

    @property
    def fixed(self) -> int:
        return sum(part.width or 0 for part in self.parts)


def message(*parts: Part, check: Callable[[object], None] | None = None) -> Callable[[type], type]:
    """Class decorator: the dataclass travels as `parts`; `check` (raising ValueError) judges a decoded
    message as a whole. Raises TypeError unless the parts carry every field exactly once."""

    def wrap(cls: type) -> type:
        bound = tuple(part.bind(cls) for part in parts)
        carried = [name for part in bound for name in part.names]
        fields = [f.name for f in dataclasses.fields(cls)]
        if sorted(carried) != sorted(fields) or sum(part.width is None for part in bound) > 1:
            raise TypeError(f"{cls.__name__}: the parts carry {carried}, the fields are {fields} "
                            "(each once, at most one variable run of parts)")
        cls.WIRE = Wire(bound, check)
        return cls

    return wrap


def wire_of(cls: type) -> Wire:
    wire = getattr(cls, "WIRE", None)
    if not isinstance(wire, Wire):
        raise TypeError(f"{cls.__name__} is not a message type (see `message`)")
    return wire


def encode(msg: object) -> list[bytes]:
    """The wire parts of a message; MessageError if a field's value cannot travel."""
    return [chunk for part in wire_of(type(msg)).parts for chunk in part.encode(msg)]


def decode(cls: type[T], parts: Sequence[bytes]) -> T:
    """The `cls` message the parts hold; MessageError (naming the type and the field) if they hold none."""
    wire = wire_of(cls)
    chunks = [bytes(part) for part in parts]
    spare = len(chunks) - wire.fixed
    if spare < 0 or (spare and all(part.width for part in wire.parts)):
        raise MessageError(f"{cls.__name__}: {len(chunks)} parts, expected {wire.fixed}")
    values: dict[str, object] = {}
    start = 0
    try:
        for part in wire.parts:
            width = spare if part.width is None else part.width
            values.update(part.decode(chunks[start : start + width]))
            start += width
        msg = cls(**values)
        if wire.check is not None:
            wire.check(msg)
    except (ValueError, TypeError) as exc:
        raise MessageError(f"{cls.__name__}: {exc}") from None
    return msg


class Family:
    """Several message types told apart by their first part, a `Const` kind tag."""

    def __init__(self, *types: type) -> None:
        self._by_kind: dict[bytes, type] = {}
        for cls in types:
            first = wire_of(cls).parts[0]
            if not isinstance(first, Const) or first.value in self._by_kind:
                raise TypeError(f"{cls.__name__} does not start with a kind tag of its own")
            self._by_kind[first.value] = cls

    def decode(self, parts: Sequence[bytes]) -> object:
        """The message whose kind the first part names; MessageError if none is, or it is malformed."""
        if not parts:
            raise MessageError("an empty message")
        cls = self._by_kind.get(bytes(parts[0]))
        if cls is None:
            raise MessageError(f"unknown kind {bytes(parts[0])[:16]!r}")
        return decode(cls, parts)
