"""The faults, each done to a running deployment while a load runs through it.

Each returns what it did (when, to which server, how long it took to come
back); a server it kills is started again on the same ports, and the router
is restarted on its own, so the rest of the load and the next fault find the
deployment whole again.

- ``abort``: clients of extra requests leave at each request state: an
  ``/abort_request`` to every server while the KV is queued or on the wire,
  a hang-up after the first token (drafting on the anchor), a hang-up halfway.
- ``stall``: the first prefill server's schedulers frozen (SIGSTOP) for longer
  than the no-progress timeout, then resumed.
- ``drop``: every TCP connection into the decode server's Lynx data endpoint
  (ZeroMQ's; Mooncake's engine and control socket) reset (`ss -K`, twice, 3 s
  apart): what is in flight on them is lost, and the senders reconnect.
- ``kill-prefill`` / ``kill-decode``: SIGKILL to the server's process group,
  then a restart on the same ports.
- ``router``: the router killed and started again on its port.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.parse
import uuid

from lynx_deploy.deployment import PDDeployment
from lynx_deploy.processes import post_json
from lynx_deploy.server import SGLangServer
from lynx_deploy.streaming import abandon

from faults.levels import lynx_state
from faults.plan import Profile

RESTART_TIMEOUT_S = 300.0
ABORT_STATES = ("on the wire", "drafting", "halfway")


def inject(fault: str, pd: PDDeployment, profile: Profile, vocab: int) -> dict:
    if fault == "abort":
        return _aborts(pd, profile, vocab)
    if fault == "stall":
        return _stall(pd.prefill, profile.transfer_timeout_s + 5.0)
    if fault == "drop":
        return _drop_connections(pd.decode, times=2, pause_s=3.0)
    if fault == "kill-prefill":
        return _kill_and_restart(pd.prefill)
    if fault == "kill-decode":
        return _kill_and_restart(pd.decode)
    if fault == "router":
        started = time.monotonic()
        pd.restart_router(down_s=2.0)
        return {"router_back_s": round(time.monotonic() - started, 1)}
    if fault == "none":
        return {}
    raise ValueError(f"unknown fault {fault!r}")


def _stall(server: SGLangServer, seconds: float) -> dict:
    pids = server.scheduler_pids()
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        time.sleep(seconds)
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGCONT)
    return {"stalled_s": seconds, "schedulers": len(pids)}


def _drop_connections(server: SGLangServer, times: int, pause_s: float) -> dict:
    """Reset the established TCP connections to the decode server's Lynx data endpoint (`/server_info`):
    ZeroMQ's ``tcp://host:port``, or Mooncake's engine (``mooncake://host:port``) and its control socket."""
    state = lynx_state(server)
    if state is None:
        raise RuntimeError("the decode server does not answer /server_info")
    endpoint = state["data_endpoint"]
    parts = urllib.parse.urlsplit(endpoint)
    targets = [parts.netloc, *(urllib.parse.urlsplit(c).netloc for c in urllib.parse.parse_qs(parts.query).get("control", []))]
    reset = 0
    for i in range(times):
        if i:
            time.sleep(pause_s)
        for target in targets:
            listed = subprocess.run(["ss", "-K", "-t", "dst", target], capture_output=True, text=True, check=True)
            reset += sum(1 for line in listed.stdout.splitlines() if "ESTAB" in line)
    return {"endpoint": endpoint, "connections_reset": reset}


def _kill_and_restart(server: SGLangServer) -> dict:
    port = server.port
    os.killpg(server.process.pid, signal.SIGKILL)
    server.stop(grace=0)  # reaps the group
    started = time.monotonic()
    server.start().wait_ready(timeout=RESTART_TIMEOUT_S)
    if server.port != port:
        raise RuntimeError(f"the restarted server moved from port {port} to {server.port}; the router cannot find it")
    return {"restart_s": round(time.monotonic() - started, 1)}


def _aborts(pd: PDDeployment, profile: Profile, vocab: int) -> dict:
    """`profile.aborts` extra requests through the router, one state after another, each abandoned."""
    rng = random.Random(profile.seed)
    outcomes = []

    def one(index: int) -> None:
        state = ABORT_STATES[index % len(ABORT_STATES)]
        rid = f"fault-abort-{uuid.uuid4().hex}"
        body = {"input_ids": [rng.randrange(100, vocab) for _ in range(profile.input_tokens)], "rid": rid,
                "sampling_params": {"max_new_tokens": profile.output_tokens, "temperature": 0, "ignore_eos": True}}  # fmt: skip
        if state == "on the wire":
            threading.Timer(1.0, _abort_everywhere, args=(pd, rid)).start()
            events = abandon(f"{pd.url}/generate", body, after_events=profile.output_tokens + 1)
        else:
            events = abandon(f"{pd.url}/generate", body, after_events=1 if state == "drafting" else profile.output_tokens // 2)
        outcomes.append({"state": state, "events_seen": events})

    threads = []
    for index in range(profile.aborts):
        threads.append(threading.Thread(target=_quietly, args=(one, index), daemon=True))
        threads[-1].start()
        time.sleep(profile.load_window_s / profile.aborts / 2)
    for thread in threads:
        thread.join(timeout=RESTART_TIMEOUT_S)
    return {"aborted": sorted(outcomes, key=lambda o: o["state"])}


def _abort_everywhere(pd: PDDeployment, rid: str) -> None:
    for server in (*pd.prefills, pd.decode):
        _quietly(post_json, f"{server.url}/abort_request", {"rid": rid}, 30)


def _quietly(function, *args) -> None:
    try:
        function(*args)
    except (OSError, urllib.error.URLError, ValueError):
        pass  # the request ended, or the stream broke, as an abort means it to
