"""A real prefill/decode deployment on one machine: two SGLang servers with --lynx and SGLang's router.

    python -m lynx_deploy --lynx-mode lynx      # starts all three, prints URLs, waits for Ctrl-C

The router is `smg` (Shepherd Model Gateway, SGLang's PD router). It adds the
bootstrap fields to every request and routes by model id, which is the
servers' `--served-model-name`.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import threading
import time
import urllib.error
from collections.abc import Callable, Sequence
from pathlib import Path

from lynx_deploy.processes import HOST, die_with_parent, free_port, log_tail, post_json, stop_group, stop_groups
from lynx_deploy.server import CPU_SERVER_ENV, PORT_ATTEMPTS, PortTaken, ServerStartError, SGLangServer
from lynx_deploy.streaming import stream_generate

SERVED_MODEL = "smollm2"

# SGLang answers /health between forward passes and fails it after
# SGLANG_HEALTH_CHECK_TIMEOUT seconds without output (20 by default); one
# forward over a 4k-token prefill chunk can take minutes on a CPU, and the
# router would drop the worker. The decode server's SGLang-side wait for the
# prefill's announcement (SGLANG_DISAGGREGATION_WAITING_TIMEOUT, 300 s) must
# cover a queue of such prefills; after it Lynx's own no-progress timeout runs.
PD_SERVER_ENV = {"SGLANG_HEALTH_CHECK_TIMEOUT": "600", "SGLANG_DISAGGREGATION_WAITING_TIMEOUT": "1800"}


def new_room() -> int:
    """A fresh bootstrap room for a request sent past the router (random like the router's, never 0)."""
    return secrets.randbelow(2**62) + 1


class PDDeployment:
    """Prefill server, decode server and router, started and stopped together.

    Args:
        model_path: model folder both servers load.
        lynx_args: `--lynx-*` arguments given to both servers (e.g. ``["--lynx-mode", "int8"]``).
        log_dir: where the three logs go.
        max_total_tokens: KV pool size of each server.
        extra_args: further arguments for both servers.
        env: extra environment for both servers (e.g. ``{"LYNX_SECRET": ...}``).
        prefill_args, decode_args: further arguments for one server only (e.g. its ``--tp-size``).
        prefill_servers: how many prefill servers feed the one decode server through the router
            (fan-in); each has its own bootstrap port. `prefill` is the first of `prefills`.

    Leaving its ``with`` block on an exception other than a failed assertion (a request that
    failed or timed out) first appends every server's Python stacks to its log
    (`SGLangServer.dump_stacks`): where a stuck server waits.
    """

    def __init__(
        self,
        model_path: str | Path,
        lynx_args: Sequence[str] = (),
        *,
        log_dir: str | Path,
        max_total_tokens: int = 16384,
        extra_args: Sequence[str] = (),
        env: dict[str, str] | None = None,
        served_model_name: str = SERVED_MODEL,
        prefill_args: Sequence[str] = (),
        decode_args: Sequence[str] = (),
        prefill_servers: int = 1,
    ) -> None:
        if prefill_servers < 1:
            raise ValueError(f"prefill_servers must be >= 1, got {prefill_servers}")
        self.log_dir = Path(log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.bootstrap_ports = [free_port() for _ in range(prefill_servers)]
        self.bootstrap_port = self.bootstrap_ports[0]
        self.served_model_name = served_model_name
        common = ["--lynx", *lynx_args, "--served-model-name", served_model_name, *extra_args]
        env = {**PD_SERVER_ENV, **(env or {})}
        self.prefills = [
            SGLangServer(
                model_path,
                [*common, *prefill_args, "--disaggregation-mode", "prefill", "--disaggregation-bootstrap-port", str(port)],
                max_total_tokens=max_total_tokens,
                log_path=self.log_dir / ("prefill.log" if i == 0 else f"prefill{i}.log"),
                env=env,
            )
            for i, port in enumerate(self.bootstrap_ports)
        ]
        self.prefill = self.prefills[0]
        self.decode = SGLangServer(
            model_path,
            [*common, *decode_args, "--disaggregation-mode", "decode",
             "--disaggregation-bootstrap-port", str(self.bootstrap_port)],  # fmt: skip
            max_total_tokens=max_total_tokens,
            log_path=self.log_dir / "decode.log",
            env=env,
        )
        self._use_router_port(free_port())
        self.router: subprocess.Popen | None = None

    def start_prefill(self, timeout: float = 600.0) -> PDDeployment:
        """Start the prefill server alone and wait until it is ready; `start` then starts the rest.

        A prefill server waits for its peers, so it may come up while another pair still
        holds the memory a decode server needs."""
        self.prefill.start()
        self.prefill.wait_ready(timeout=timeout)
        return self

    def start(self, timeout: float = 600.0) -> PDDeployment:
        """Start all three (the prefill server unless `start_prefill` did) and wait until a
        request through the router is answered."""
        deadline = time.monotonic() + timeout
        for prefill in self.prefills:
            if prefill.process is None:
                prefill.start()
        self.decode.start()
        for server in (*self.prefills, self.decode):
            server.wait_ready(timeout=deadline - time.monotonic())
        for attempt in range(PORT_ATTEMPTS):  # a server may take the router's port before the router binds it
            self._start_router()
            try:
                self._wait_router(deadline)
                return self
            except PortTaken:
                if attempt == PORT_ATTEMPTS - 1:
                    raise
                self._use_router_port(free_port())  # another process took it while the servers started
        return self

    def _use_router_port(self, port: int) -> None:
        self.router_port = port
        self.url = f"http://{HOST}:{port}"

    def _start_router(self) -> None:
        smg = Path(sys.executable).with_name("smg")
        command = [
            str(smg) if smg.exists() else "smg",
            "launch",
            "--pd-disaggregation",
            *[arg for server, port in zip(self.prefills, self.bootstrap_ports) for arg in ("--prefill", server.url, str(port))],
            "--decode", self.decode.url,
            "--host", HOST,
            "--port", str(self.router_port),
            "--prometheus-host", HOST,
            "--prometheus-port", str(free_port()),
            "--worker-startup-check-interval", "1",
            "--health-check-interval-secs", "5",
            # SGLang answers /health between forward passes; on a CPU one pass over a
            # long prompt takes tens of seconds, and three 5 s timeouts in a row would
            # take the worker out of rotation.
            "--health-check-timeout-secs", "120",
            # A request that fails must reach the caller: a retry would hide it behind a
            # second attempt (with another transfer room) that succeeds.
            "--disable-retries",
            "--log-level", "warn",
        ]  # fmt: skip
        log = open(self.log_dir / "router.log", "ab")  # noqa: SIM115 - owned by the child
        self.router = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **CPU_SERVER_ENV},
            start_new_session=True, preexec_fn=die_with_parent,
        )  # fmt: skip
        log.close()

    def restart_router(self, down_s: float = 0.0, timeout: float = 120.0) -> None:
        """Kill the router (its clients' connections drop), leave it down `down_s` seconds, and start
        it again on the same port; returns once a request through it is answered."""
        if self.router is not None:
            stop_group(self.router, grace=0)
        time.sleep(down_s)
        self._start_router()
        self._wait_router(time.monotonic() + timeout)

    def _wait_router(self, deadline: float) -> None:
        body = {"model": self.served_model_name, "prompt": "Hi", "max_tokens": 1, "temperature": 0}
        while time.monotonic() < deadline:
            if self.router is None or self.router.poll() is not None:
                tail = log_tail(self.log_dir / "router.log")
                error = PortTaken if "Address already in use" in tail else ServerStartError
                raise error(f"router exited\n{tail}")
            try:
                post_json(f"{self.url}/v1/completions", body, timeout=60)
                return
            except OSError:
                time.sleep(1.0)
        raise ServerStartError(f"router not ready in time\n{log_tail(self.log_dir / 'router.log')}")

    def bootstrap_fields(self, room: int | None = None) -> dict:
        """What the router adds to a request for this pair: the prefill's bootstrap address and
        bootstrap room `room` (a `new_room` if None)."""
        room = new_room() if room is None else room
        return {"bootstrap_host": HOST, "bootstrap_port": self.bootstrap_port, "bootstrap_room": room}

    def generate_direct(
        self,
        body: dict,
        room: int | None = None,
        timeout: float = 600.0,
        after_prefill: Callable[[], None] | None = None,
    ) -> tuple[dict | str, dict | str]:
        """POST `/generate` to prefill and decode with bootstrap room `room` (a `new_room` if None),
        bypassing the router.

        `after_prefill` runs once the prefill server has answered (its KV is
        then on its way) while the decode server may still be receiving.
        Returns ``(prefill_answer, decode_answer)``; an answer is the decoded
        JSON, or the error text when the server answered with an HTTP error.
        """
        fields = self.bootstrap_fields(room)
        answers: dict[str, dict | str] = {}

        def call(name: str, server: SGLangServer) -> None:
            try:
                answers[name] = post_json(f"{server.url}/generate", {**body, **fields}, timeout)
            except urllib.error.HTTPError as exc:
                answers[name] = exc.read().decode(errors="replace")
            except OSError as exc:
                answers[name] = f"{type(exc).__name__}: {exc}"
            if name == "prefill" and after_prefill is not None:
                after_prefill()

        threads = [threading.Thread(target=call, args=item) for item in (("prefill", self.prefill), ("decode", self.decode))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return answers["prefill"], answers["decode"]

    def stream_direct(self, body: dict, room: int | None = None, nth=(1,), timeout: float = 600.0) -> dict:
        """A streaming `/generate` sent to both servers with bootstrap room `room` (a `new_room` if
        None), bypassing the router: `stream_generate`'s timings of the decode server's stream, plus
        ``prefill_s``, when the prefill server answered (its own measure of the request: bootstrap,
        prefill, KV snapshot)."""

        fields = self.bootstrap_fields(room)
        prefill: dict = {}

        def call() -> None:
            try:
                prefill["answer"] = post_json(f"{self.prefill.url}/generate", {**body, **fields}, timeout)
            except OSError as exc:
                prefill["error"] = f"{type(exc).__name__}: {exc}"

        thread = threading.Thread(target=call)
        thread.start()
        try:
            result = stream_generate(f"{self.decode.url}/generate", {**body, **fields}, nth, timeout)
        finally:
            thread.join(timeout)
        if "answer" not in prefill:
            raise RuntimeError(f"the prefill server did not answer: {prefill.get('error', 'timed out')}")
        return {**result, "prefill_s": prefill["answer"]["meta_info"]["e2e_latency"]}

    def stop(self) -> None:
        """Stop the router and both servers together."""
        running = [p for p in (self.router, self.decode.process, *(s.process for s in self.prefills)) if p is not None]
        stop_groups(running)
        self.router = self.decode.process = None
        for server in self.prefills:
            server.process = None

    def __enter__(self) -> PDDeployment:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, exc_type, exc, traceback) -> None:
        if exc_type is not None and issubclass(exc_type, Exception) and not issubclass(exc_type, AssertionError):
            # a request that failed or timed out: each server's log gets where its processes wait
            for server in (*self.prefills, self.decode):
                server.dump_stacks(f"the deployment stops after {exc_type.__name__}: {str(exc)[:200]}")
        self.stop()
