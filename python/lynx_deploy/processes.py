"""Processes and ports for local servers: free ports on loopback, process groups that end together.

A server started here runs in its own process group and gets SIGTERM when the
thread that started it dies (`die_with_parent`); `stop_groups` ends whole groups
(scheduler and detokenizer children included), whatever state they are in.
"""

from __future__ import annotations

import ctypes
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path

HOST = "127.0.0.1"
PR_SET_PDEATHSIG = 1

# Ports handed out so far by this process (a server binds its port tens of seconds later).
_HANDED_OUT: set[int] = set()
_RANDOM = random.SystemRandom()  # unrelated to any seed a test sets, and across processes
EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def free_port() -> int:
    """A port free on 127.0.0.1 now, not handed out before by this process, and below the
    kernel's ephemeral range: outgoing connections and `bind(port 0)` take their ports
    from that range at any moment, so a port picked there can be gone by the time the
    server binds it."""
    low = _ephemeral_low()
    for _ in range(200):
        port = _RANDOM.randrange(max(1024, low - 12000), low) if low > 2048 else _kernel_port()
        if port not in _HANDED_OUT and _bindable(port):
            _HANDED_OUT.add(port)
            return port
    raise RuntimeError("no free port on 127.0.0.1")


def _ephemeral_low() -> int:
    try:
        return int(EPHEMERAL_RANGE_FILE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def _kernel_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((HOST, port))
        except OSError:
            return False
    return True


def die_with_parent() -> None:
    """In a child before exec: get SIGTERM when the process that started it dies, however it dies.

    So a test run killed outright (out of memory, SIGKILL) leaves no server behind. The
    signal follows the thread that started the child: start servers from a thread that
    lives as long as they should.
    """
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def log_tail(path: Path, lines: int = 40) -> str:
    """The last `lines` lines of a log file (for error messages)."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def post_json(url: str, body: dict, timeout: float = 600.0):
    """POST `body` as JSON and return the decoded JSON answer."""
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read())


def process_tree(pid: int) -> list:
    """Process `pid` and every descendant of it (psutil processes)."""
    import psutil

    root = psutil.Process(pid)
    return [root, *root.children(recursive=True)]


def dump_stacks(pids: Sequence[int], log_path: Path, reason: str, timeout: float = 30.0) -> None:
    """Append each process's Python stacks, every thread (``py-spy dump``, which SGLang installs), to
    `log_path` under a line naming `reason`: what a stuck server's processes were waiting in. A
    process py-spy cannot read (gone, no permission to trace it) gets py-spy's error instead."""
    spy = shutil.which("py-spy", path=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]))
    with open(log_path, "a") as log:
        log.write(f"\n==== Python stacks at {time.strftime('%H:%M:%S')}: {reason} ====\n")
        if spy is None:
            log.write("py-spy not found\n")
            return
        for pid in pids:
            try:
                done = subprocess.run([spy, "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=timeout)
                log.write(done.stdout + (f"{pid}: {(done.stderr.strip() or 'no stacks').splitlines()[0]}\n" if done.returncode else ""))
            except subprocess.TimeoutExpired:
                log.write(f"{pid}: py-spy dump took over {timeout:.0f} s\n")


def stop_group(process: subprocess.Popen, grace: float = 15.0) -> None:
    """End the process group led by `process`: SIGTERM, then SIGKILL after `grace` seconds."""
    stop_groups([process], grace)


def stop_groups(processes: Sequence[subprocess.Popen], grace: float = 15.0) -> None:
    """End the process groups led by `processes` together (SIGTERM to all, then SIGKILL to what
    is left after `grace` seconds), so stopping several servers takes as long as the slowest."""
    left = list(processes)
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 10.0)):
        for process in left:
            try:
                os.killpg(process.pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + wait
        still = []
        for process in left:
            try:
                process.wait(timeout=max(0.0, deadline - time.monotonic()))
                _wait_group_gone(process.pid, max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                still.append(process)
        left = still
        if not left:
            return


def _wait_group_gone(pgid: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        if time.monotonic() >= deadline:
            raise subprocess.TimeoutExpired(f"process group {pgid}", timeout)
        time.sleep(0.2)
