"""A prefill forward's layers as they are written: the per-layer count the encoder waits on.

A streaming prefill forward (`lynx_patches.pd.layer_hooks`) advances a
`ForwardLayers` layer by layer while the encoder thread encodes and sends what
is written. The end of the forward completes it whatever the hooks saw.

On the CPU platform the forward runs synchronously: the KV of layer ``l`` is
in the pool when the hook for layer ``l`` runs. On a GPU the hook runs when the
write is queued, not done, so each advance records an event on the forward's
stream (`DeviceMarks`) and the encoder thread waits for it before reading; a
forward whose hooks did not report every layer (its KV written elsewhere)
completes at a device-wide synchronization instead.
"""

from __future__ import annotations

import threading
from typing import NamedTuple, Protocol

import torch



class Mark(Protocol):
    """A point in a device's queued work (a device event): `query` says whether the device has
    reached it, `synchronize` blocks until it has."""

    def query(self) -> bool: ...

    def synchronize(self) -> None: ...


class DeviceMarks:
    """Marks in the work queued on a GPU pool's device, to wait for from another thread.

    `mark` records an event on the calling thread's current stream (in the
    `set_kv_buffer` hook: the forward's stream, after that layer's write);
    `everything` stands for all work queued on the device when it is waited for.
    """

    def __init__(self, device: torch.device) -> None:
        self._device = device

    def mark(self) -> Mark:
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(self._device))
        return event

    def everything(self) -> Mark:
        return _DeviceDrain(self._device)


class _DeviceDrain(NamedTuple):
    device: torch.device

    def query(self) -> bool:
        return False  # not known without waiting

    def synchronize(self) -> None:
        torch.cuda.synchronize(self.device)


class ForwardLayers:
    """How many layers of one prefill forward have their KV in the pool.

    The scheduler thread advances it (`written`) and ends it (`finish`); the
    encoder thread waits on it (`wait`). With `marks` (a GPU pool) a layer
    counts as written once the device has reached the mark recorded with it;
    the host queues a forward far ahead of the device, so the encoder takes
    the layers the device has done, not all those reported.
    """

    def __init__(self, num_layers: int, marks: DeviceMarks | None = None) -> None:
        self.num_layers = num_layers
        self._marks = marks
        self._cond = threading.Condition()
        self._written = 0
        self._ready: list[tuple[int, Mark]] = []  # (layer count, its mark), counts rising (GPU pools)
        self._failed = False

    def written(self, count: int) -> None:
        """The KV of the first `count` layers is written (on a GPU: queued on the current stream)."""
        mark = self._marks.mark() if self._marks is not None else None
        with self._cond:
            if count > self._written:
                self._written = min(count, self.num_layers)
                if mark is not None:
                    self._ready.append((self._written, mark))
                self._cond.notify_all()

    def finish(self, completed: bool) -> None:
        """The forward returned (every layer written, or queued) or raised (nothing more will be)."""
        with self._cond:
            if completed:
                if self._written < self.num_layers and self._marks is not None:
                    self._ready.append((self.num_layers, self._marks.everything()))
                self._written = self.num_layers
            else:
                self._failed = True
            self._cond.notify_all()

    def wait(self, beyond: int, stop: threading.Event, poll_s: float = 0.5) -> int | None:
        """Block until more than `beyond` layers are written (on a GPU: until the device has written
        them); their count, or None if the forward failed (or `stop` is set) first."""
        with self._cond:
            while self._written <= beyond and not self._failed and not stop.is_set():
                self._cond.wait(poll_s)
            if self._written <= beyond:
                return None
            if self._marks is None:
                return self._written
            pending = [(count, mark) for count, mark in self._ready if count > beyond]
        return _reached(pending)


def _reached(pending: list[tuple[int, Mark]]) -> int:
    """The most layers the device has written of `pending` ``(count, mark)`` (counts rising, marks in
    one stream's order, so a mark reached means every earlier one was): waits for the first mark
    if the device has reached none."""
    first_count, first_mark = pending[0]
    first_mark.synchronize()
    reached = first_count
    for count, mark in pending[1:]:
        if not mark.query():
            break
        reached = count
    return reached
