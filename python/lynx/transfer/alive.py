"""The alive message: a sender is still computing a room's KV, so silence is not a stall.

On the wire ``[ALIVE_TAG, (version u8, room u64, counter u64) big-endian, MAC]``:
the `Alive` message of `lynx.transfer.messages`, sealed with the room's
transfer key (`lynx.transfer.frames.seal`). The counter grows with every alive
message of the sender, so a receiver takes each one once.
"""

from __future__ import annotations

from dataclasses import dataclass

from lynx.transfer.frames import peek, seal, unseal
from lynx.transfer.messages import Const, Packed, encode, message

ALIVE_TAG = b"LYNX_ALIVE"
ALIVE_VERSION = 2


@message(Const(ALIVE_TAG), Packed("BQQ", "version", "room", "counter"))
@dataclass(frozen=True)
class Alive:
    """The sender of `room` is still computing it; `counter` is above every earlier one of the sender.
    Any `version` decodes (the room of another version's message is readable); `open_alive` takes only
    `ALIVE_VERSION`."""

    room: int
    counter: int
    version: int = ALIVE_VERSION


def encode_alive(room: int, counter: int, key: bytes) -> list[bytes]:
    """The sealed wire message of `Alive(room, counter)`, keyed by the room's transfer."""
    return seal(key, encode(Alive(room, counter)))


def alive_room(parts: list[bytes]) -> int | None:
    """The room an alive message names, unauthenticated (check it with `open_alive`); None if not one."""
    alive = peek(Alive, parts)
    return None if alive is None else alive.room


def open_alive(parts: list[bytes], key: bytes) -> int | None:
    """The counter of an alive message of this version signed with `key` (its room's transfer key), else None."""
    alive = peek(Alive, parts)
    if alive is None or alive.version != ALIVE_VERSION or unseal(key, parts) is None:
        return None
    return alive.counter
