"""The lifecycle of a room on a prefill rank: one `PrefillRoomState`, changed only by `advance`.

The states:

* ``UNCLAIMED``: decode metadata is held but no sender claimed the room here
  (yet); forgotten once the metadata is stale (`PrefillRooms.purge`).
* ``CLAIMED``: a live sender holds the room; its chunks are counted and its
  segments encoded; its decode ranks hear nothing from here (nothing announced
  yet, or, after ``QUIET``, every stream of it queued or its sending failed).
* ``ANNOUNCED``: a manifest of it went out while its prefill computes: the
  alive thread tells its decode ranks it is alive.
* ``ENCODING`` / ``ANNOUNCED_ENCODING``: ``CLAIMED`` / ``ANNOUNCED`` while the
  encoder reads the room's KV pages (they must not be freed).
* ``ABORTED``: given up while claimed: nothing more of it is planned, encoded
  or announced alive, until its sender releases it.
* ``ABORTED_ENCODING``: aborted while the encoder reads its pages; when the
  reading ends it sees the abort, and the room is ``ABORTED``.

The sender's release drops a room whatever its state. `TRANSITIONS` is the
whole table, keyed by state and `PrefillEvent`; `advance` is the one place
it is applied.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from types import MappingProxyType

from lynx.lifecycle import RefusedTransition


class PrefillRoomState(enum.Enum):
    UNCLAIMED = "unclaimed"
    CLAIMED = "claimed"
    ENCODING = "encoding"
    ANNOUNCED = "announced"
    ANNOUNCED_ENCODING = "announced_encoding"
    ABORTED = "aborted"
    ABORTED_ENCODING = "aborted_encoding"

    @property
    def claimed(self) -> bool:
        """A live sender holds the room (a second one is refused)."""
        return self is not PrefillRoomState.UNCLAIMED

    @property
    def encoding(self) -> bool:
        """The encoder reads the room's KV pages right now."""
        return self in ENCODING_STATES

    @property
    def aborted(self) -> bool:
        """Nothing more of the room is planned, encoded or announced alive."""
        return self in (PrefillRoomState.ABORTED, PrefillRoomState.ABORTED_ENCODING)

    @property
    def alive(self) -> bool:
        """The alive thread tells the room's announced decode ranks it is still computing."""
        return self in (PrefillRoomState.ANNOUNCED, PrefillRoomState.ANNOUNCED_ENCODING)


class PrefillEvent(enum.Enum):
    CLAIM = "claim"  # a sender claims the room
    START_ENCODING = "start_encoding"  # the encoder starts reading its pages
    END_ENCODING = "end_encoding"  # the encoder is done reading them
    ANNOUNCE = "announce"  # a manifest of it went out
    QUIET = "quiet"  # no more alive messages: every stream queued, or its sending failed
    ABORT = "abort"  # given up


_S, _E = PrefillRoomState, PrefillEvent
ENCODING_STATES = frozenset({_S.ENCODING, _S.ANNOUNCED_ENCODING, _S.ABORTED_ENCODING})

TRANSITIONS: Mapping[tuple[PrefillRoomState, PrefillEvent], PrefillRoomState] = MappingProxyType({
    (_S.UNCLAIMED, _E.CLAIM): _S.CLAIMED,
    (_S.CLAIMED, _E.START_ENCODING): _S.ENCODING,
    (_S.CLAIMED, _E.ANNOUNCE): _S.ANNOUNCED,
    (_S.CLAIMED, _E.ABORT): _S.ABORTED,
    (_S.ENCODING, _E.END_ENCODING): _S.CLAIMED,
    (_S.ENCODING, _E.ANNOUNCE): _S.ANNOUNCED_ENCODING,
    (_S.ENCODING, _E.ABORT): _S.ABORTED_ENCODING,
    (_S.ANNOUNCED, _E.START_ENCODING): _S.ANNOUNCED_ENCODING,
    (_S.ANNOUNCED, _E.QUIET): _S.CLAIMED,
    (_S.ANNOUNCED, _E.ABORT): _S.ABORTED,
    (_S.ANNOUNCED_ENCODING, _E.END_ENCODING): _S.ANNOUNCED,
    (_S.ANNOUNCED_ENCODING, _E.QUIET): _S.ENCODING,
    (_S.ANNOUNCED_ENCODING, _E.ABORT): _S.ABORTED_ENCODING,
    (_S.ABORTED_ENCODING, _E.END_ENCODING): _S.ABORTED,
})
"""The state each event moves each state to; every other pair is refused."""


def allows(current: PrefillRoomState, event: PrefillEvent) -> bool:
    """Whether `TRANSITIONS` allows `event` in `current`."""
    return (current, event) in TRANSITIONS


def advance(current: PrefillRoomState, event: PrefillEvent) -> PrefillRoomState:
    """The state `event` moves `current` to.

    Raises:
        RefusedTransition: `TRANSITIONS` does not allow `event` in `current`.
    """
    try:
        return TRANSITIONS[current, event]
    except KeyError:
        raise RefusedTransition(f"a prefill room {current.name} refuses {event.name}") from None
