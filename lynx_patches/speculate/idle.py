"""No busy wait on a decode server whose requests wait for KV.

SGLang's decode loop never blocks while a request is in its disaggregation
queues: with nothing to run it yields with ``sleep(0)`` and polls again,
which keeps a core busy (half of this 2-core machine, slowing the prefill the
request waits for). `IdleWait.wait` runs after SGLang's idle housekeeping
when the server is not fully idle (a fully idle SGLang already sleeps on its
sockets) and sleeps in one poll of the scheduler's sockets until something
can progress:

* a request or control message arrives on those sockets;
* a transfer changes state (`wake`, called by the hook on SGLang's
  `update_status`: an anchor or a whole KV landed, a room failed), through a
  pipe polled with the sockets;
* a residual lands or a room fails (`landed`, the decode side's thread event; while
  requests are parked waiting for one, the poll is cut into `SLICE_S` slices
  to look at it);
* or `MAX_WAIT_S` passes, which bounds how late anything else SGLang polls
  for (its own timeouts) is seen.

It does not wait at all while this rank holds a residual that another decode
rank of its tensor-parallel group still waits for (`ready`): the verify pass
needs every rank, and this rank then waits for the others in their next
collective instead (SGLang's loop runs one per iteration). Every wait is
bounded by `MAX_WAIT_S` whatever happens, so a rank asleep here holds a rank
waiting for it in a collective for at most that long: ranks above 0 have no
request sockets (SGLang broadcasts requests from rank 0), and nothing that
ends the wait depends on another rank.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable

MAX_WAIT_S = 0.1
SLICE_S = 0.005


class IdleWait:
    """Sleeps a decode scheduler between idle iterations.

    Args:
        scheduler: SGLang's scheduler (its `is_fully_idle` and its idle sleeper's sockets,
            `scheduler_sockets`).
        landed: set by the decode side's data thread when a residual lands or a room fails.
        parked: whether requests wait for a residual outside SGLang's queues.
        ready: whether a residual applied here waits for the other decode ranks (no wait then).
    """

    def __init__(
        self,
        scheduler,
        landed: threading.Event,
        parked: Callable[[], bool],
        ready: Callable[[], bool] = lambda: False,
        max_wait_s: float = MAX_WAIT_S,
        clock=time.monotonic,
    ):
        self.scheduler = scheduler
        self.landed = landed
        self.parked = parked
        self.ready = ready
        self.max_wait_s = max_wait_s
        self.clock = clock
        self._read, self._write = os.pipe()
        os.set_blocking(self._read, False)
        os.set_blocking(self._write, False)
        self._poller = None

    def wake(self) -> None:
        """Any thread: end the current (or the next) wait."""
        try:
            os.write(self._write, b"\0")
        except BlockingIOError:  # the pipe is full: a wake-up is pending anyway
            pass

    def wait(self) -> None:
        if self.ready() or self.scheduler.is_fully_idle():
            return
        poller = self._poller or self._make_poller()
        slice_s = SLICE_S if self.parked() else self.max_wait_s
        deadline = self.clock() + self.max_wait_s
        while not self.landed.is_set():
            left = deadline - self.clock()
            if left <= 0:
                return
            ready = dict(poller.poll(min(left, slice_s) * 1000))
            if ready:
                if self._read in ready:
                    self._drain()
                return

    def close(self) -> None:
        os.close(self._read)
        os.close(self._write)

    def _make_poller(self):
        import zmq

        self._poller = zmq.Poller()
        self._poller.register(self._read, zmq.POLLIN)
        for socket in scheduler_sockets(self.scheduler):
            self._poller.register(socket, zmq.POLLIN)
        return self._poller

    def _drain(self) -> None:
        try:
            while os.read(self._read, 4096):
                pass
        except BlockingIOError:
            pass


def scheduler_sockets(scheduler) -> list:
    """The sockets SGLang's idle sleeper polls for requests and control messages.

    None without a sleeper (`--sleep-on-idle` off, or a rank that does not
    receive requests), nor with the Rust server's, which parks on its request
    ring instead of sockets.
    """
    from sglang.srt.managers.scheduler_components.idle_sleeper import RustServerIdleSleeper

    sleeper = scheduler.idle_sleeper
    if sleeper is None or isinstance(sleeper, RustServerIdleSleeper):
        return []
    return [socket for socket, _ in sleeper.poller.sockets]
