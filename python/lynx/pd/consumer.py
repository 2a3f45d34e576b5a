"""What the consumer of a decode side's rooms (the speculation controller) needs from it: `DecodeSideView`.

The controller runs on the scheduler thread and owns a request's room once
its anchor has landed (`DecodeSide.hand_over`); this is the whole of what it
reads and calls there. `lynx.pd.decode_side.DecodeSide` is the one
implementation; the controller's tests hold it to exactly these members.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from lynx.config import LynxConfig
    from lynx.transfer.rooms import RoomState


class DecodeSideView(Protocol):
    """A decode rank's transfer rooms as the speculation controller sees them (scheduler thread).

    Attributes:
        config: the server's Lynx configuration (mode, speculative cap).
        landed: set by the data thread when a residual lands or a room fails;
            the controller clears it at the start of each iteration and its
            idle wait sleeps until it is set.
        draft_window_s: how long a request can draft on its anchor here,
            written by the controller each iteration and sent to the prefill.
    """

    config: LynxConfig
    landed: threading.Event
    draft_window_s: float

    def timings(self, room: int) -> dict[str, float]:
        """The request's transfer milestones so far (seconds since it arrived); {} once it is gone."""
        ...

    def check(self, room: int) -> str | None:
        """The request's transfer failure (deadlines checked first), or None."""
        ...

    def room_state(self, room: int) -> RoomState | None:
        """The request's transfer state; None once its room is gone (the transfer was lost)."""
        ...

    def apply_residual(self, room: int) -> bool:
        """Apply what has landed of the request's residual; True once all of it is applied."""
        ...

    def forget(self, room: int) -> None:
        """The request ended: drop its room (asking the prefill to stop sending if KV is still coming)."""
        ...

