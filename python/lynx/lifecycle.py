"""What the three lifecycles share (a decode request's `request_lifecycle`, a receiving room's
`transfer/room_lifecycle`, a prefill room's `pd/prefill_lifecycle`): the refusal of a move their
transition table does not allow, and applying a table of allowed next states."""

from __future__ import annotations

import enum
from collections.abc import Collection, Mapping
from typing import TypeVar

State = TypeVar("State", bound=enum.Enum)


class RefusedTransition(ValueError):
    """A move (or an event) the transition table does not allow in the current state."""


def move(table: Mapping[State, Collection[State]], current: State, to: State, what: str) -> State:
    """`to`, if `table` lists it among the states `current` may move to.

    Raises:
        RefusedTransition: the table does not allow it (the message names `what` and both states).
    """
    if to not in table[current]:
        raise RefusedTransition(f"{what} may not move from {current.name} to {to.name}")
    return to
