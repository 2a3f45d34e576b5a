"""A running server's Lynx state, as `/server_info` reports it (`lynx_patches.observe`), and a
poller that waits for it to reach a condition."""

from __future__ import annotations

import time
from collections.abc import Callable

from lynx_deploy.server import SGLangServer


def lynx_state(server: SGLangServer) -> dict:
    """The first scheduler's Lynx state (`internal_states[0]["lynx"]`)."""
    return server.get_json("/server_info")["internal_states"][0]["lynx"]


def wait_lynx_state(server: SGLangServer, ready: Callable[[dict], object], wait_s: float, poll_s: float = 0.5) -> dict:
    """Poll `lynx_state` every `poll_s` until `ready(state)` holds or `wait_s` has passed; the last state."""
    deadline = time.monotonic() + wait_s
    state = lynx_state(server)
    while not ready(state) and time.monotonic() < deadline:
        time.sleep(poll_s)
        state = lynx_state(server)
    return state
