"""Start and stop real SGLang server processes (tests, scripts and benchmarks share this).

A server is `python -m sglang.launch_server ...` in its own process group, bound
to 127.0.0.1 on a free port; `stop()` ends the whole group (scheduler and
detokenizer children included), whatever state it is in.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Hashable, Sequence
from pathlib import Path

from lynx_deploy.processes import HOST, die_with_parent, dump_stacks, free_port, log_tail, post_json, process_tree, stop_group

# What a small server needs on a CPU-only machine: one OpenMP thread per server
# (two cores are shared by several processes), every plane on loopback, no hub.
CPU_SERVER_ENV = {"OMP_NUM_THREADS": "1", "SGLANG_HOST_IP": HOST, "HF_HUB_OFFLINE": "1"}
# Model arguments for CPUs without bf16 matrix units: compute in fp32 (about six
# times faster than bf16 here) while the KV cache, which crosses the link, stays bf16.
CPU_MODEL_ARGS = ("--dtype", "float32", "--kv-cache-dtype", "bfloat16")


PORT_ATTEMPTS = 3  # a server whose port another process bound first restarts on a fresh one
# asyncio's message when a server cannot bind; uvicorn then hangs in shutdown instead of exiting.
BIND_FAILED = re.compile(r"error while attempting to bind on address \('[^']*', (\d+)\)")
# A scheduler that could not listen on its torch.distributed port (SGLang picks it free at launch and
# binds it later, so another process can take it meanwhile): the server exits.
DIST_PORT_TAKEN = re.compile(r"DistNetworkError: The server socket has failed to listen.*EADDRINUSE")


class ServerStartError(RuntimeError):
    """The server exited or did not answer in time; the message has its log tail."""


class PortTaken(ServerStartError):
    """A port the server needed was bound by another process first."""


class SGLangServer:
    """One `sglang.launch_server` process group.

    Args:
        model_path: model folder.
        args: further launch_server arguments (e.g. ``["--lynx"]``).
        port: HTTP port; a free one by default.
        max_total_tokens: KV pool size in tokens (CPU memory is counted machine-wide, so this, not
            the memory fraction, sizes the pool).
        log_path: file receiving the server's stdout and stderr.
    """

    def __init__(
        self,
        model_path: str | Path,
        args: Sequence[str] = (),
        *,
        port: int | None = None,
        max_total_tokens: int = 16384,
        log_path: str | Path | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.log_path = Path(log_path) if log_path else Path(os.devnull)
        self.command = [
            sys.executable, "-m", "sglang.launch_server",
            "--model-path", str(model_path),
            "--host", HOST,
            "--port", "",  # _use_port
            # CPU memory is the machine's free memory, which other servers of a test run share: a
            # fraction that leaves room for the weights even when little is free (the pool is still
            # bounded by --max-total-tokens).
            "--mem-fraction-static", "0.8",
            "--max-total-tokens", str(max_total_tokens),
            *args,
        ]  # fmt: skip
        self._use_port(port or free_port())
        self.env = {**os.environ, **CPU_SERVER_ENV, **(env or {})}
        self.process: subprocess.Popen | None = None
        self._log_start = 0  # where this start's lines begin in the (appended) log

    def _use_port(self, port: int) -> None:
        self.port = port
        self.url = f"http://{HOST}:{port}"
        self.command[self.command.index("--port") + 1] = str(port)

    def start(self) -> SGLangServer:
        log = open(self.log_path, "ab")  # noqa: SIM115 - owned by the child
        self._log_start = log.tell()
        self.process = subprocess.Popen(
            self.command,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=self.env,
            start_new_session=True,
            preexec_fn=die_with_parent,
        )
        log.close()
        return self

    def wait_ready(self, timeout: float = 300.0) -> SGLangServer:
        """Block until the server answers `/v1/models`; raise ServerStartError otherwise.

        A server that could not bind its HTTP port or its scheduler's torch.distributed port
        (another process took it after it was picked) is restarted on fresh ports, up to
        PORT_ATTEMPTS starts in all.
        """
        deadline = time.monotonic() + timeout
        starts = 1
        while time.monotonic() < deadline:
            if self.process is None or self.process.poll() is not None:
                if self.process is not None and starts < PORT_ATTEMPTS and self._log_search(DIST_PORT_TAKEN):
                    starts = self._start_again(starts)
                    continue
                raise ServerStartError(f"server exited during start-up\n{self.log_tail()}")
            taken = self._port_taken()
            if taken is not None:
                if taken != self.port or starts == PORT_ATTEMPTS:
                    raise PortTaken(f"port {taken} was taken by another process\n{self.log_tail()}")
                starts = self._start_again(starts)
                continue
            if self.get_json("/v1/models", quiet=True) is not None:
                return self
            time.sleep(1.0)
        raise ServerStartError(f"server not ready after {timeout:.0f}s\n{self.log_tail()}")

    def _start_again(self, starts: int) -> int:
        """Stop this start and start again on a fresh HTTP port (SGLang picks its other ports anew);
        the count of starts so far."""
        self.stop()
        self._use_port(free_port())
        self.start()
        return starts + 1

    def _port_taken(self) -> int | None:
        """The HTTP port this start failed to bind, from its log; None if it has not failed so."""
        match = self._log_search(BIND_FAILED)
        return int(match.group(1)) if match else None

    def _log_search(self, pattern: re.Pattern) -> re.Match | None:
        """`pattern` in what this start wrote to the log."""
        try:
            with open(self.log_path, "rb") as log:
                log.seek(self._log_start)
                return pattern.search(log.read().decode(errors="replace"))
        except OSError:
            return None

    def get_json(self, path: str, quiet: bool = False):
        try:
            with urllib.request.urlopen(self.url + path, timeout=5) as resp:
                return json.loads(resp.read())
        except (urllib.error.URLError, ConnectionError, TimeoutError, json.JSONDecodeError):
            if quiet:
                return None
            raise

    def post_json(self, path: str, body: dict, timeout: float = 600.0):
        return post_json(self.url + path, body, timeout)

    def flush_cache(self, wait_s: float = 30.0) -> None:
        """Empty the server's prefix cache, waiting up to `wait_s` for running requests to end."""
        req = urllib.request.Request(f"{self.url}/flush_cache?timeout={wait_s:g}", data=b"", method="POST")
        with urllib.request.urlopen(req, timeout=wait_s + 30) as resp:
            resp.read()

    def log_tail(self, lines: int = 40) -> str:
        return log_tail(self.log_path, lines)

    def scheduler_pids(self) -> list[int]:
        """Process ids of the server's scheduler processes (they hold the KV and the Lynx threads)."""
        if self.process is None:
            return []
        children = process_tree(self.process.pid)[1:]
        return [child.pid for child in children if "scheduler" in " ".join(child.cmdline() or [child.name()])]

    def dump_stacks(self, reason: str) -> None:
        """Append the Python stacks of the server's processes (HTTP server, schedulers, detokenizer)
        to its log (`processes.dump_stacks`)."""
        import psutil

        if self.process is None or self.process.poll() is not None:
            return
        try:
            pids = [process.pid for process in process_tree(self.process.pid)]
        except psutil.NoSuchProcess:
            return
        dump_stacks(pids, self.log_path, reason)

    def stop(self, grace: float = 15.0) -> None:
        """End the server's process group: SIGTERM, then SIGKILL after `grace` seconds."""
        if self.process is not None:
            stop_group(self.process, grace)
            self.process = None

    def __enter__(self) -> SGLangServer:
        self.start()
        try:
            return self.wait_ready()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc) -> None:
        self.stop()


class ServerSlot:
    """At most one server running, started for a key: `serve(key, make)` gives the URL of the server
    started for `key`, first stopping one started for another key and starting `make()` (a server
    not yet started) in its place. A server that does not get ready is stopped."""

    def __init__(self) -> None:
        self._running: tuple[Hashable, SGLangServer] | None = None

    def serve(self, key: Hashable, make: Callable[[], SGLangServer]) -> str:
        if self._running is not None and self._running[0] != key:
            self.close()
        if self._running is None:
            self._running = (key, make().__enter__())
        return self._running[1].url

    def close(self) -> None:
        if self._running is not None:
            self._running[1].stop()
            self._running = None

    def __enter__(self) -> ServerSlot:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
