"""What an idle deployment holds, and waiting for it to hold no more than that again.

Per server, with its prefix cache emptied: the scheduler's free KV slots and free request rows and the rooms
Lynx's transfer holds (`/server_info`), and its processes' resident memory,
threads and open file descriptors, summed over the server's process tree,
and those descriptors by kind (TCP and Unix sockets, eventfds, pipes, epolls,
files: `fd_kinds`), so that a growth says what grew.
"""

from __future__ import annotations

import os
import time
from collections import Counter

import psutil
from lynx_deploy.deployment import PDDeployment
from lynx_deploy.server import SGLangServer

MEMORY_SLACK = 1.05  # idle memory after a fault may exceed the baseline by 5%
# Below this much available memory the kernel evicts the servers' mapped pages and their resident
# memory reads low (a baseline read so compares every later level against too little).
LOW_MEMORY_MIB = 2048


def servers(pd: PDDeployment) -> dict[str, SGLangServer]:
    names = {f"prefill{i}" if i else "prefill": s for i, s in enumerate(pd.prefills)}
    return {**names, "decode": pd.decode}


def lynx_state(server: SGLangServer) -> dict | None:
    """The first scheduler's Lynx state in `/server_info`; None while the server does not answer."""
    info = server.get_json("/server_info", quiet=True)
    return None if info is None else info["internal_states"][0]["lynx"]


def server_levels(server: SGLangServer) -> dict | None:
    """One server's levels; None while it does not answer."""
    lynx = lynx_state(server)
    if lynx is None or server.process is None:
        return None
    rss = threads = fds = 0
    kinds: Counter[str] = Counter()
    try:
        root = psutil.Process(server.process.pid)
        for process in (root, *root.children(recursive=True)):
            with process.oneshot():
                rss += process.memory_info().rss
                threads += process.num_threads()
                fds += process.num_fds()
            kinds.update(fd_kinds(process))
    except psutil.Error:
        return None
    return {"kv_free_slots": lynx["kv_free_slots"], "req_rows_free": lynx["req_rows_free"],
            "transfer_rooms": lynx.get("transfer_rooms", 0), "rss_mib": round(rss / 2**20, 1), "threads": threads,
            "fds": fds, "fd_kinds": dict(kinds)}  # fmt: skip


def fd_kinds(process: psutil.Process) -> Counter[str]:
    """The process's open descriptors by kind: ``tcp`` and ``unix`` sockets (``socket`` for any other
    family), ``eventfd``, ``eventpoll``, ``pipe``, ``file`` (and any other anonymous inode by its name)."""
    tcp = {c.fd for c in process.net_connections("tcp")}
    unix = {c.fd for c in process.net_connections("unix")}
    kinds: Counter[str] = Counter()
    folder = f"/proc/{process.pid}/fd"
    for name in os.listdir(folder):
        try:
            target = os.readlink(f"{folder}/{name}")
        except OSError:
            continue  # closed meanwhile
        fd = int(name)
        if target.startswith("socket:"):
            kinds["tcp" if fd in tcp else "unix" if fd in unix else "socket"] += 1
        elif target.startswith("anon_inode:"):
            kinds[target.removeprefix("anon_inode:").strip("[]")] += 1
        else:
            kinds["pipe" if target.startswith("pipe:") else "file"] += 1
    return kinds


def available_mib() -> int:
    """The machine's available memory (MiB)."""
    return psutil.virtual_memory().available // 2**20


def levels(pd: PDDeployment) -> dict[str, dict | None]:
    return {name: server_levels(server) for name, server in servers(pd).items()}


def idle(now: dict[str, dict | None], baseline: dict[str, dict]) -> bool:
    """Every server answers, holds no room, and has its baseline's free slots and rows back."""
    return all(
        level is not None
        and level["transfer_rooms"] == 0
        and level["kv_free_slots"] >= baseline[name]["kv_free_slots"]
        and level["req_rows_free"] >= baseline[name]["req_rows_free"]
        for name, level in now.items()
    )


def wait_idle(pd: PDDeployment, baseline: dict[str, dict], wait_s: float) -> tuple[dict, float]:
    """Poll until `idle` (or `wait_s` passed): the last levels and the seconds waited. Once no server
    holds a room, their prefix caches are emptied first: cached prompts hold slots by design."""
    started = time.monotonic()
    now = levels(pd)
    while True:
        if all(level is not None and level["transfer_rooms"] == 0 for level in now.values()):
            for server in servers(pd).values():
                _flush(server)
            now = levels(pd)
        if idle(now, baseline) or time.monotonic() - started >= wait_s:
            return now, time.monotonic() - started
        time.sleep(1.0)
        now = levels(pd)


def _flush(server: SGLangServer) -> None:
    try:
        server.flush_cache(wait_s=10)
    except OSError:
        pass  # requests still running: the next poll tries again


def compare(now: dict[str, dict | None], baseline: dict[str, dict]) -> dict:
    """What `now` holds beyond `baseline`: slots, rows and rooms still held, memory ratio, thread and fd
    growth (and ``fd_growth``: per server, each kind of descriptor whose count changed)."""
    out = {"slots_held": 0, "rows_held": 0, "rooms_held": 0, "memory_ratio": 0.0, "threads_delta": 0, "fds_delta": 0,
           "fd_growth": {}, "unanswering": []}  # fmt: skip
    for name, level in now.items():
        base = baseline[name]
        if level is None:
            out["unanswering"].append(name)
            continue
        out["slots_held"] += max(0, base["kv_free_slots"] - level["kv_free_slots"])
        out["rows_held"] += max(0, base["req_rows_free"] - level["req_rows_free"])
        out["rooms_held"] += level["transfer_rooms"]
        out["memory_ratio"] = max(out["memory_ratio"], round(level["rss_mib"] / base["rss_mib"], 3))
        out["threads_delta"] += level["threads"] - base["threads"]
        out["fds_delta"] += level["fds"] - base["fds"]
        was, kinds = base.get("fd_kinds", {}), level.get("fd_kinds", {})
        changed = {kind: kinds.get(kind, 0) - was.get(kind, 0) for kind in sorted({*was, *kinds})}
        if any(changed.values()):
            out["fd_growth"][name] = {kind: delta for kind, delta in changed.items() if delta}
    return out
