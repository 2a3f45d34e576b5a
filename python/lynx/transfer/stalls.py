"""Which peers the sender gives up: one that cannot take a message for too long, or whose check fails."""

from __future__ import annotations

import time
from collections.abc import Callable


class StallWatch:
    """Times how long each endpoint has been unable to take a message.

    Args:
        timeout_s: an endpoint not ready for this long is given up.
        clock: seconds, monotonic.

    Not thread-safe: the sender calls it under its lock.
    """

    def __init__(self, timeout_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.timeout_s, self._clock = timeout_s, clock
        self._stalled_since: dict[str, float] = {}

    def check(self, endpoint: str, ready: Callable[[str], bool]) -> tuple[bool, str | None]:
        """``(ready, give_up)``: whether ``ready(endpoint)`` holds now, and why to give the endpoint up, if so.

        ``give_up`` is set when ``ready`` raised, or when the endpoint has not
        been ready since ``timeout_s`` ago; its stall is then forgotten.
        """
        try:
            if ready(endpoint):
                self._stalled_since.pop(endpoint, None)
                return True, None
            failure = None
        except Exception as exc:
            failure = f"{type(exc).__name__}: {exc}"
        now = self._clock()
        since = self._stalled_since.setdefault(endpoint, now)
        if failure is None and now - since < self.timeout_s:
            return False, None
        self._stalled_since.pop(endpoint, None)
        return False, failure or (
            f"decode peer {endpoint} took no data for {self.timeout_s:g} s (dead, unreachable or not reading)"
        )
