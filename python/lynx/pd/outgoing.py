"""One room's tokens as the prefill computes them: the segments each chunk or forward completes.

Pure bookkeeping of the scheduler thread, kept under `PrefillRooms`' lock: no
encoding, no sending, no clock.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np


class Segment(NamedTuple):
    """A segment of a room's tokens whose KV is all computed: ready to encode."""

    index: int
    first_token: int
    slots: np.ndarray  # pool slots of its tokens
    total: int  # tokens of the whole room


@dataclass
class Outgoing:
    """A room whose KV leaves segment by segment as the prefill computes it."""

    total: int  # tokens the decode ranks reserved, exactly what must be sent
    layout: list[tuple[int, int]]  # (first_token, num_tokens) of each segment
    slots: list[np.ndarray] = field(default_factory=list)  # pool slots of the tokens computed so far
    computed: int = 0
    queued: int = 0  # segments handed to the encoder
    streamed: np.ndarray | None = None  # slots of the tokens through the last segment handed over while computed

    def add_chunk(self, slots: np.ndarray, is_last: bool) -> tuple[list[Segment], str | None]:
        """Account one prefilled chunk whose tokens have pool slots `slots`.

        Returns the segments the chunk completes, and why the room must fail (or
        None): the prefill's token count differs from the one the decode ranks
        reserved, or the chunks' slots differ from those segments were streamed
        from while computed. With a problem, no segment is returned.
        """
        self.slots.append(slots)
        self.computed += len(slots)
        if self.computed > self.total or (is_last and self.computed != self.total):
            return [], f"the decode ranks reserved {self.total} tokens, this prefill has {self.computed} to send"
        if self.streamed is not None:
            problem = self._streamed_mismatch()
            if problem is not None:
                return [], problem
        return self.take_segments(np.concatenate(self.slots)), None

    def begin_forward(self, slots: np.ndarray) -> list[Segment]:
        """A forward is about to compute the tokens through ``len(slots)``, whose pool slots are
        `slots`: the segments it completes that no earlier chunk handed over, now handed over;
        [] when it completes none or would exceed the tokens reserved."""
        if not self.computed < len(slots) <= self.total:
            return []
        slots = np.asarray(slots, dtype=np.int64)
        segments = self.take_segments(slots)
        if segments:
            self.streamed = slots[: sum(self.layout[self.queued - 1])]
        return segments

    def take_segments(self, slots: np.ndarray) -> list[Segment]:
        """The segments not handed over yet that `slots` (those of the first ``len(slots)``
        tokens) complete, now handed over."""
        segments = []
        while self.queued < len(self.layout) and sum(self.layout[self.queued]) <= len(slots):
            first, tokens = self.layout[self.queued]
            segments.append(Segment(self.queued, first, slots[first : first + tokens], self.total))
            self.queued += 1
        return segments

    def _streamed_mismatch(self) -> str | None:
        """Why the chunks' slots differ from those segments were streamed from while computed, or
        None; forgets the streamed slots once the chunks cover them."""
        covered = min(self.computed, len(self.streamed))
        if not np.array_equal(np.concatenate(self.slots)[:covered], self.streamed[:covered]):
            return "the prefilled chunks' KV slots differ from those its segments were sent from while computed"
        if covered == len(self.streamed):
            self.streamed = None
        return None
