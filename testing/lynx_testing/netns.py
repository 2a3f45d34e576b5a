"""Run a command in a private network namespace that has nothing but loopback.

Mooncake's transfer engine (0.3.13) listens on every interface whatever
address it is given. Tests and benchmarks that start it run inside such a
namespace, so its ports exist on an isolated loopback only:

    python -m lynx_testing.netns -- python -m pytest test/lynx/transfer/test_transport.py

The command re-executes itself under `unshare --net` (root, or unprivileged
user namespaces), brings the namespace's `lo` up and then runs the command.
`INSIDE_ENV` is set in the command's environment.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import socket
import struct
import subprocess
import sys

INSIDE_ENV = "LYNX_ISOLATED_NETNS"
_SIOCGIFFLAGS, _SIOCSIFFLAGS, _IFF_UP = 0x8913, 0x8914, 0x1


def isolated(argv: list[str]) -> list[str]:
    """The command line that runs `argv` in a fresh network namespace with loopback up."""
    unshare = shutil.which("unshare")
    if unshare is None:
        raise RuntimeError("`unshare` (util-linux) is needed to give Mooncake a private network namespace")
    return [unshare, "--net", sys.executable, "-m", "lynx_testing.netns", "--inside", "--", *argv]


def run_isolated(argv: list[str], **kwargs) -> subprocess.CompletedProcess:
    """`subprocess.run` of `argv` in a private network namespace (see `isolated`)."""
    return subprocess.run(isolated(argv), **kwargs)


def bring_loopback_up() -> None:
    """Set `lo` up in the current network namespace (a new one starts with it down)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack("16sH14x", b"lo", 0)
        flags = struct.unpack("16sH14x", fcntl.ioctl(sock, _SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(sock, _SIOCSIFFLAGS, struct.pack("16sH14x", b"lo", flags | _IFF_UP))


def main(argv: list[str]) -> int:
    inside = argv[:1] == ["--inside"]
    command = argv[argv.index("--") + 1 :] if "--" in argv else []
    if not command:
        print("usage: python -m lynx_testing.netns -- COMMAND [ARGS...]", file=sys.stderr)
        return 2
    if not inside:
        return subprocess.call(isolated(command))
    bring_loopback_up()
    os.execvpe(command[0], command, {**os.environ, INSIDE_ENV: "1"})
    return 1  # not reached


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
