"""Supervised worker threads: a loop that dies is reported and restarted, never lost silently.

Each loop is a function that returns when its stop event is set. If it raises
instead, ``on_crash(name, error)`` runs (e.g. to fail the requests the loop was
serving) and the loop starts again after ``backoff_s``. More than
``max_restarts`` crashes within ``window_s`` seconds mark the supervisor
``broken`` (with the last error): the server should then stop accepting work
and show it in its health.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable

logger = logging.getLogger(__name__)


class Supervisor:
    def __init__(
        self,
        on_crash: Callable[[str, str], None],
        *,
        max_restarts: int = 5,
        window_s: float = 60.0,
        backoff_s: float = 0.5,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._on_crash = on_crash
        self._max_restarts, self._window_s, self._backoff_s = max_restarts, window_s, backoff_s
        self._clock = clock
        self._crashes: deque[float] = deque()
        self._lock = threading.Lock()
        self.stop = threading.Event()
        self.broken: str | None = None
        self.restarts = 0
        self._threads: list[threading.Thread] = []

    def start(self, name: str, loop: Callable[[], None]) -> None:
        """Run ``loop`` in daemon thread ``name`` until `stop` is set."""
        thread = threading.Thread(target=self._run, args=(name, loop), name=name, daemon=True)
        self._threads.append(thread)
        thread.start()

    def _run(self, name: str, loop: Callable[[], None]) -> None:
        while not self.stop.is_set():
            try:
                loop()
                return
            except Exception as exc:  # the point of supervising: no error ends a loop silently
                error = f"{type(exc).__name__}: {exc}"
                logger.exception("Lynx thread %s crashed", name)
                self._record(name, error)
                try:
                    self._on_crash(name, error)
                except Exception:
                    logger.exception("Lynx: handling the crash of %s failed", name)
                if self.broken is not None or self.stop.wait(self._backoff_s):
                    return

    def _record(self, name: str, error: str) -> None:
        with self._lock:
            now = self._clock()
            self._crashes.append(now)
            while self._crashes and now - self._crashes[0] > self._window_s:
                self._crashes.popleft()
            self.restarts += 1
            if len(self._crashes) > self._max_restarts:
                self.broken = f"thread {name} crashed {len(self._crashes)} times in {self._window_s:g}s: {error}"

    def close(self, timeout_s: float = 5.0) -> None:
        self.stop.set()
        for thread in self._threads:
            if thread is not threading.current_thread():
                thread.join(timeout_s)
