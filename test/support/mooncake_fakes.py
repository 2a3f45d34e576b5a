"""An in-process stand-in for Mooncake's TransferEngine, so the Mooncake transport and listener
run in unit tests without the engine: registered buffers are plain process memory, and a write
is a memmove that has landed by the time its handle is polled."""

from __future__ import annotations

import ctypes
import itertools
import threading

import numpy as np
from lynx.transfer.mooncake.engine import WriteStatus

_PORTS = itertools.count(20000)


class FakeEngine:
    """`MooncakeEngine`'s interface over this process's memory (every session is this process)."""

    def __init__(self, host: str = "127.0.0.1", protocol: str = "tcp", device: str = "") -> None:
        self.protocol = protocol
        self.session = f"{host}:{next(_PORTS)}"
        self.writes = 0
        self._lock = threading.Lock()

    def register(self, buffer: np.ndarray) -> int:
        return buffer.ctypes.data

    def write(self, session: str, source: int, target: int, length: int) -> int:
        with self._lock:
            ctypes.memmove(target, source, length)
            self.writes += 1
            return self.writes

    def status(self, handle: int) -> WriteStatus:
        return WriteStatus.DONE

    def close(self) -> None:
        pass


def use_fake_engine(monkeypatch) -> None:
    """Make every Mooncake transport and listener built afterwards in this test use `FakeEngine`."""
    from lynx.transfer.mooncake import listener as mooncake_listener, transport as mooncake_transport

    monkeypatch.setattr(mooncake_transport, "MooncakeEngine", FakeEngine)
    monkeypatch.setattr(mooncake_listener, "MooncakeEngine", FakeEngine)
