"""The Mooncake sender's registered staging buffers: where a message's large parts wait for their write.

RDMA can only read registered memory, and the caller's buffers are not, so
``MooncakeTransport.send`` copies each message into one staging slot (a
copy costs about 0.02 CPU s/GB here, against 1 s/GB for the frame MAC); the
slot is released once the engine reports the write landed. Each endpoint
holds at most its quota of the slots (`acquire`), so messages stuck on their
way to a dead or stalled endpoint never keep the others waiting.
"""

from __future__ import annotations

import threading
import time

import numpy as np

from lynx.transfer.mooncake.engine import MooncakeEngine
from lynx.transfer.transport import TransportError


class Staging:
    """Registered send buffers: ``slots`` slots of ``slot_bytes``, handed out one per message."""

    def __init__(self, engine: MooncakeEngine, slots: int, slot_bytes: int) -> None:
        self.slot_bytes = slot_bytes
        self.buffer = np.zeros(slots * slot_bytes, dtype=np.uint8)
        self.address = engine.register(self.buffer)
        self._free = list(range(slots))
        self._owners: dict[int, str] = {}  # slot -> the endpoint whose message it holds
        self._cond = threading.Condition()

    def acquire(self, deadline: float, where: str, quota: int) -> int:
        """A free slot for a message to endpoint `where`, which may hold `quota` slots at most;
        waits until `deadline` (clock: `time.monotonic`), then raises TransportError."""
        with self._cond:
            while not self._free or self._held(where) >= quota:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TransportError(f"send to {where} timed out waiting for a staging buffer: "
                                         "earlier messages are not getting through (peer dead, stalled or slow)")
                self._cond.wait(remaining)
            index = self._free.pop()
            self._owners[index] = where
            return index

    def available(self, where: str, quota: int) -> int:
        """Slots free now for a message to `where` (none once it holds its `quota`)."""
        with self._cond:
            return len(self._free) if self._held(where) < quota else 0

    def release(self, index: int | None) -> None:
        if index is None:
            return
        with self._cond:
            self._owners.pop(index, None)
            self._free.append(index)
            self._cond.notify_all()

    def fill(self, index: int, views: list[memoryview]) -> None:
        slot = self.buffer[index * self.slot_bytes : (index + 1) * self.slot_bytes]
        offset = 0
        for view in views:
            np.copyto(slot[offset : offset + len(view)], np.frombuffer(view, dtype=np.uint8))
            offset += len(view)

    def _held(self, where: str) -> int:
        return sum(owner == where for owner in self._owners.values())
