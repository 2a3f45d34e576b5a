"""The wire format each room is encoded with: the mode's, or under `--lynx-mode auto` the one chosen
for the room at its first segment from the link's backlog and the prefill's pace (`lynx.auto`).

Used by the encoder thread only.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from lynx.auto import LinkView, PrefillRate, choose
from lynx.config import LynxConfig
from lynx.kvwire import WireFormat
from lynx.transfer.sender import PrioritySender

from lynx.pd.pool import PoolView


class RoomWires:
    """Per room still encoding, its wire format; the prefill's pace the auto choice reads.

    Args:
        config: the lynx config (its mode, and the wire formats by name).
        wire: the mode's wire format, that of every room the auto mode has not chosen for.
        sender: the link whose backlog and rate the auto choice reads.
        clock: seconds, monotonic; times each room's prefill.
    """

    def __init__(
        self, config: LynxConfig, wire: WireFormat, sender: PrioritySender, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._config, self._wire, self._sender, self._clock = config, wire, sender, clock
        self._chosen: dict[int, WireFormat] = {}
        self.rate = PrefillRate()

    def of(self, room: int) -> WireFormat:
        """The room's wire format."""
        return self._chosen.get(room, self._wire)

    def choose(self, room: int, total: int, pool: PoolView) -> None:
        """A room's first segment (of a `total`-token transfer from `pool`) is being encoded: under
        `--lynx-mode auto`, choose its wire format for every segment, once, and start timing its
        prefill."""
        if self._config.mode != "auto" or room in self._chosen:
            return
        wires = self._config.wires
        request_bytes = sum(wires["int8"].stream_sizes(pool.shape(total)))
        link = LinkView(self._sender.stats().queued_bytes, self._sender.link_bytes_per_s)
        self._chosen[room] = wires[choose(link, request_bytes, self.rate.seconds(total))]
        self.rate.started(room, total, self._clock())

    def finished(self, room: int) -> None:
        """The room's prefill is done (its metadata is being sent): time it, and forget the room."""
        self.rate.finished(room, self._clock())
        self.forget(room)

    def forget(self, room: int) -> None:
        """The room needs no more encoding decisions (done, aborted or failed)."""
        self._chosen.pop(room, None)
        self.rate.forget(room)
