"""Mooncake's ``TransferEngine`` behind a narrow wrapper: P2P handshake, registered host buffers, async writes.

``mooncake`` is imported when an engine is made, never at module import, so
the ``lynx`` core installs and its tests run without it. Install it with the
``mooncake`` extra (``mooncake-transfer-engine-non-cuda``), plus Debian's
``libibverbs1``, ``libnl-3-200`` and ``libnl-route-3-200``, which the engine
links against even when it only speaks TCP.

Protocols:

* ``"tcp"``: the engine's TCP transport. The engine picks RDMA whenever it
  finds an RDMA device, so this sets ``MC_FORCE_TCP=1`` in the process
  environment (read by every engine initialized afterwards in the process).
* ``"rdma"``: the engine's RDMA transport on the devices named by ``device``
  (comma-separated, e.g. ``"mlx5_0,mlx5_1"``; empty: all). Registered memory
  is pinned and written by the NIC without the receiver's CPU.

No metadata server: engines find each other by P2P handshake on their RPC
port. Mooncake 0.3.13 listens on every interface (0.0.0.0 and ::) for that
handshake and for TCP data whatever ``host`` says; ``host`` is only the
address it advertises.
"""

from __future__ import annotations

import enum
import logging
import os
import threading

import numpy as np

from lynx.transfer.transport import TransportError

logger = logging.getLogger(__name__)

PROTOCOLS = ("tcp", "rdma")
INSTALL_HINT = (
    "install the mooncake extra (pip install 'lynx-kv[mooncake]', i.e. mooncake-transfer-engine-non-cuda) "
    "and Debian's libibverbs1 libnl-3-200 libnl-route-3-200"
)


class WriteStatus(enum.Enum):
    """Where a submitted write stands."""

    PENDING = "pending"
    DONE = "done"
    FAILED = "failed"


class MooncakeEngine:
    """One ``TransferEngine`` in P2P-handshake mode, advertised at ``host``.

    Args:
        host: address peers reach this engine at (``127.0.0.1`` for loopback).
        protocol: ``"tcp"`` or ``"rdma"`` (see the module docstring).
        device: RDMA device filter; ignored for TCP.

    Raises:
        TransportError: mooncake is missing, or the engine failed to start.

    Thread-safe: calls are serialized by one lock (each is short; writes are asynchronous).
    """

    def __init__(self, host: str = "127.0.0.1", protocol: str = "tcp", device: str = "") -> None:
        if protocol not in PROTOCOLS:
            raise ValueError(f"protocol must be one of {PROTOCOLS}, got {protocol!r}")
        try:
            from mooncake.engine import TransferEngine
        except ImportError as exc:
            raise TransportError(f"the Mooncake transport needs the mooncake package: {INSTALL_HINT} ({exc})") from exc
        if protocol == "tcp":
            os.environ["MC_FORCE_TCP"] = "1"
        elif os.environ.get("MC_FORCE_TCP"):
            raise TransportError("protocol 'rdma' was asked for but MC_FORCE_TCP is set in the environment")
        self.protocol = protocol
        self._engine = TransferEngine()
        status = self._engine.initialize(host, "P2PHANDSHAKE", protocol, "" if protocol == "tcp" else device)
        if status != 0:
            self._engine = None
            raise TransportError(f"Mooncake TransferEngine.initialize({host!r}, P2PHANDSHAKE, {protocol!r}) failed")
        self.session = f"{host}:{self._engine.get_rpc_port()}"
        self._registered: list[int] = []
        self._lock = threading.Lock()

    def register(self, buffer: np.ndarray) -> int:
        """Register a C-contiguous uint8 array (kept alive by the caller); return its address."""
        if buffer.dtype != np.uint8 or not buffer.flags.c_contiguous or buffer.ndim != 1:
            raise ValueError("a registered buffer must be a 1-D C-contiguous uint8 array")
        address = buffer.ctypes.data
        with self._lock:
            if self._live().register_memory(address, buffer.nbytes) != 0:
                raise TransportError(f"Mooncake could not register {buffer.nbytes} bytes at {address:#x}")
            self._registered.append(address)
        return address

    def write(self, session: str, source: int, target: int, length: int) -> int:
        """Start writing ``length`` bytes from local ``source`` to ``target`` in ``session``; return its handle."""
        with self._lock:
            handle = self._live().transfer_submit_write(session, source, target, length)
        if handle == 0:
            raise TransportError(f"Mooncake could not start a {length}-byte write to {session} (peer unreachable?)")
        return handle

    def status(self, handle: int) -> WriteStatus:
        """Poll a write; DONE and FAILED release the handle, so poll each handle until then and no more."""
        with self._lock:
            code = self._live().transfer_check_status(handle)
        if code == 1:
            return WriteStatus.DONE
        if code == 0:
            return WriteStatus.PENDING
        return WriteStatus.FAILED

    def close(self) -> None:
        """Unregister every buffer and stop the engine; idempotent. Buffers may be freed afterwards."""
        with self._lock:
            engine, self._engine = self._engine, None
        if engine is None:
            return
        for address in self._registered:
            if engine.unregister_memory(address) != 0:
                logger.warning("Mooncake could not unregister the buffer at %#x", address)
        self._registered.clear()
        del engine

    def _live(self):
        if self._engine is None:
            raise TransportError("the Mooncake engine is closed")
        return self._engine
