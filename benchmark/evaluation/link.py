"""The emulated prefill->decode link: `tc` shaping of the loopback device in a private network namespace.

The evaluation runs inside `python -m lynx_testing.netns` (a network namespace
with nothing but loopback, which Mooncake's engine needs here anyway), so the
loopback device carries only its own servers' traffic. An HTB qdisc sends
every packet through one class limited to the link rate, except packets from
or to the HTTP ports (clients, the router, the bootstrap server), which take
an unlimited class: on a cluster those are not on the KV link. Because the
kernel shapes, SGLang's stock Mooncake backend crosses the same link as Lynx,
and the rate changes between requests without restarting a server.

Bytes already past a sender's own scheduler queue in FIFO order: ZeroMQ's
high-water mark (4 frames) plus the socket buffers. The namespace's TCP send
buffer and per-socket queue are capped (`TCP_SYSCTLS`) so that this stays
about 1 MiB with 128 KiB frames (`--lynx-chunk-bytes`).
"""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from pathlib import Path

from lynx_testing.netns import INSIDE_ENV

DEVICE = "lo"
TCP_SYSCTLS = {
    "net/ipv4/tcp_wmem": "4096 65536 262144",
    "net/ipv4/tcp_limit_output_bytes": "262144",
}
_UNLIMITED = "100gbit"


def inside_namespace(environ) -> bool:
    """Whether this process runs in the private namespace `lynx_testing.netns` made."""
    return environ.get(INSIDE_ENV) == "1"


class ShapedLoopback:
    """Sets the loopback device's rate for everything but the exempt ports.

    Only use inside a private network namespace: it rewrites the device's
    qdisc and the namespace's TCP buffer limits.
    """

    def __init__(self, device: str = DEVICE, run=subprocess.run) -> None:
        self.device = device
        self._run = run
        self.gbps: float | None = None

    def configure_tcp(self) -> None:
        """Cap TCP send buffers and per-socket queues (this namespace only)."""
        for key, value in TCP_SYSCTLS.items():
            Path("/proc/sys", key).write_text(value)

    def set_rate(self, gbps: float | None, exempt_ports: Sequence[int] = ()) -> None:
        """Shape to `gbps` Gbit/s (None: unshaped); `exempt_ports` bypass the limit."""
        if gbps is not None and not gbps > 0:
            raise ValueError(f"link rate must be > 0 Gbit/s or None, got {gbps!r}")
        self._tc("qdisc", "del", "dev", self.device, "root", check=False)
        self.gbps = gbps
        if gbps is None:
            return
        rate = f"{round(gbps * 1e9)}bit"
        self._tc("qdisc", "add", "dev", self.device, "root", "handle", "1:", "htb", "default", "10")
        self._tc("class", "add", "dev", self.device, "parent", "1:", "classid", "1:10",
                 "htb", "rate", rate, "ceil", rate, "burst", "32k", "cburst", "32k")  # fmt: skip
        self._tc("class", "add", "dev", self.device, "parent", "1:", "classid", "1:20",
                 "htb", "rate", _UNLIMITED, "ceil", _UNLIMITED)  # fmt: skip
        for port in exempt_ports:
            for side in ("sport", "dport"):
                self._tc("filter", "add", "dev", self.device, "parent", "1:", "protocol", "ip", "prio", "1",
                         "u32", "match", "ip", side, str(port), "0xffff", "flowid", "1:20")  # fmt: skip

    def _tc(self, *args: str, check: bool = True) -> None:
        result = self._run(["tc", *args], capture_output=True, text=True)
        if check and result.returncode != 0:
            raise RuntimeError(f"tc {' '.join(args)} failed: {result.stderr.strip()}")
