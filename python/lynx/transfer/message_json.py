"""The JSON part codec of `lynx.transfer.messages` (the manifest body), bounded before it is parsed."""

from __future__ import annotations

import dataclasses
import json
import typing

from lynx.checks import is_int
from lynx.transfer.message_parts import MessageError, Part


class Json(Part):
    """Every field of the message as one JSON object with sorted keys, at most ``max_bytes`` and nested
    ``max_depth`` deep. Field types come from the annotations: int, str, bool, tuple[int, ...]; a field
    with a default may be absent."""

    def __init__(self, max_bytes: int, max_depth: int) -> None:
        self.max_bytes, self.max_depth = max_bytes, max_depth
        self._types: dict[str, object] = {}
        self._required: frozenset[str] = frozenset()

    def bind(self, cls: type) -> Part:
        bound = Json(self.max_bytes, self.max_depth)
        hints = typing.get_type_hints(cls)
        fields = dataclasses.fields(cls)
        bound.names = tuple(f.name for f in fields)
        bound._types = {f.name: hints[f.name] for f in fields}
        bound._required = frozenset(f.name for f in fields if f.default is dataclasses.MISSING)
        for name, hint in bound._types.items():
            if hint not in (int, str, bool, tuple[int, ...]):
                raise TypeError(f"{cls.__name__}.{name}: no JSON form for {hint}")
        return bound

    def pack(self, *values: object) -> bytes:
        fields = dict(zip(self.names, values))
        for name, value in fields.items():
            _check_json_type(name, value, self._types[name])
        return json.dumps(fields, sort_keys=True).encode()

    def decode(self, chunks: list[bytes]) -> dict[str, object]:
        data = chunks[0]
        if len(data) > self.max_bytes:
            raise MessageError(f"{len(data)} bytes of JSON, at most {self.max_bytes}")
        depth = json_depth(data)
        if depth > self.max_depth:
            raise MessageError(f"JSON nested {depth} deep, at most {self.max_depth}")
        try:
            fields = json.loads(data)
        except ValueError as exc:
            raise MessageError(f"not JSON: {exc}") from None
        if not isinstance(fields, dict):
            raise MessageError("not a JSON object")
        unknown, missing = fields.keys() - self._types.keys(), self._required - fields.keys()
        if unknown or missing:
            raise MessageError(f"unknown fields {sorted(unknown)}, missing fields {sorted(missing)}")
        for name, value in fields.items():
            _check_json_type(name, value, self._types[name])
        return {name: tuple(value) if isinstance(value, list) else value for name, value in fields.items()}


def _check_json_type(name: str, value: object, hint: object) -> None:
    if hint is int:
        ok = is_int(value)
    elif hint == tuple[int, ...]:
        ok = isinstance(value, (tuple, list)) and all(is_int(v) for v in value)
    else:
        ok = type(value) is hint
    if not ok:
        raise MessageError(f"{name}: expected {hint}, got {value!r}"[:200])


def json_depth(data: bytes) -> int:
    """How deep the arrays and objects of a JSON text nest (brackets inside strings not counted),
    in one pass without recursion."""
    depth = deepest = 0
    in_string = escaped = False
    for byte in bytes(data):
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:  # backslash
                escaped = True
            elif byte == 0x22:  # quote
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in (0x5B, 0x7B):  # [ {
            depth += 1
            deepest = max(deepest, depth)
        elif byte in (0x5D, 0x7D):  # ] }
            depth -= 1
    return deepest
