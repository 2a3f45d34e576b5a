"""ZeroMQ and Mooncake transports side by side: unpaced throughput, paced accuracy, CPU per GB, MAC cost.

Each variant sends with PrioritySender (frames signed at submission, as in
serving) to a receiver in its own process over 127.0.0.1. Variants:

* ``zmq``: ZmqTransport / ZmqListener in plaintext (``--lynx-plaintext-data``).
* ``zmq-curve``: the same with CurveZMQ, as served by default (every byte
  encrypted and authenticated by libsodium).
* ``zmq-zc``: the same sender; the receiver takes frames without copying
  them out of ZeroMQ (``recv_multipart(copy=False)``), a candidate change.
* ``mooncake``: MooncakeTransport / MooncakeListener over Mooncake's TCP
  transport; the listener copies each message out of its arena (``copy=True``).
* ``mooncake-view``: the same with ``copy=False``: the receiver reads the
  arena in place (sound only on a trusted fabric).
* ``mooncake-engine``: the engine alone, the ceiling here: writes of one chunk
  each from a registered buffer into a registered arena, four in flight, no
  frames, no notifications (``raw`` only; timed at the sender, from the first
  write to the last completion).

Each variant runs at every ``--chunks-kib`` size. Receive modes: ``raw``
counts the bytes the transport delivers; ``frames`` also checks every frame's
MAC (``decode_frame``) and copies it into a ``RequestAssembly``, as the decode
side does. Unpaced throughput is the bytes over the time from the end of
``submit`` (frames signed, the first one leaving) to the receiver's last
arrival (one monotonic clock for both processes). Paced accuracy is measured
at the receiver from arrival times: the bytes after the first chunk over
(last arrival - first arrival), so the chunk the full bucket lets go at once
does not inflate it. CPU seconds
per GB are process times (all threads, the engines' included): the sender's
from the end of ``submit`` (signing is done by then) until the receiver
reports, the receiver's from its first arrival to its last. Repeats run the
variants round-robin, so machine noise hits them alike; medians are reported.
Progress goes to stderr, tables to stdout, ``--json PATH`` writes every sample.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import json
import multiprocessing
import os
import platform
import resource
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import zmq

from lynx.transfer.frames import decode_frame, peek_room
from lynx.transfer.keys import curve_keys
from lynx.transfer.pacer import make_pacer
from lynx.transfer.reassembly import RequestAssembly
from lynx.transfer.sender import PrioritySender
from lynx.transfer.zmq_transport import ZmqListener, ZmqTransport
from lynx_testing import provenance

KEY = b"transport-compare-benchmark"
COST_TOTAL_BYTES, COST_PIECE_BYTES = 1 << 30, 1 << 20  # byte_costs: 1 GiB in 1 MiB pieces
STREAM = 1
VARIANTS = ("zmq", "zmq-curve", "zmq-zc", "mooncake", "mooncake-view", "mooncake-engine")


class ZeroCopyZmqListener(ZmqListener):
    """ZmqListener whose ``recv`` hands out views of ZeroMQ's own buffers instead of copies."""

    def recv(self, timeout_s: float):
        with self._lock:
            if not self._poller.poll(max(0, round(timeout_s * 1000))):
                return None
            return [frame.buffer for frame in self._socket.recv_multipart(zmq.NOBLOCK, copy=False)]


def cpu_seconds(pid: int | None = None) -> float:
    """Process CPU seconds (user + system, all threads) of this process or of ``pid``."""
    if pid is None:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return usage.ru_utime + usage.ru_stime
    with open(f"/proc/{pid}/stat") as handle:
        fields = handle.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def make_listener(variant: str, max_payload: int):
    if variant.startswith("mooncake"):
        from lynx.transfer.mooncake.transport import MooncakeListener

        return MooncakeListener(KEY, slots=16, slot_bytes=max_payload, slots_per_peer=8, copy=variant == "mooncake")
    listener_class = ZeroCopyZmqListener if variant == "zmq-zc" else ZmqListener
    curve = curve_keys(KEY) if variant == "zmq-curve" else None
    return listener_class(max_message_bytes=max_payload + 64, curve=curve)


def make_transport(variant: str, max_payload: int):
    if variant.startswith("mooncake"):
        from lynx.transfer.mooncake.transport import MooncakeTransport

        return MooncakeTransport(KEY, send_timeout_s=60, staging_slots=8, staging_slot_bytes=max_payload)
    return ZmqTransport(send_timeout_s=60, curve=curve_keys(KEY) if variant == "zmq-curve" else None)


def serve_arena(size: int, results) -> None:
    """Receiver process of ``mooncake-engine``: a registered arena and nothing else."""
    from lynx.transfer.mooncake.engine import MooncakeEngine

    engine = MooncakeEngine()
    arena = np.zeros(size, dtype=np.uint8)
    results.put((engine.session, engine.register(arena)))
    while True:
        time.sleep(3600)


class EnginePeer:
    """``mooncake-engine``: the engine's own throughput between registered buffers, four writes in flight."""

    DEPTH = 4

    def __init__(self, max_payload: int, context) -> None:
        from lynx.transfer.mooncake.engine import MooncakeEngine

        self.variant, results = "mooncake-engine", context.Queue()
        self.process = context.Process(target=serve_arena, args=(self.DEPTH * max_payload, results), daemon=True)
        self.process.start()
        self.session, self.arena = results.get(timeout=120)
        self.engine = MooncakeEngine()
        self.source = np.frombuffer(os.urandom(self.DEPTH * max_payload), dtype=np.uint8).copy()
        self.address = self.engine.register(self.source)

    def run(self, room: int, data: bytes, mode: str, chunk_bytes: int, rate_gbps: float) -> dict:
        from lynx.transfer.mooncake.engine import WriteStatus

        if mode != "raw" or rate_gbps:
            raise ValueError("mooncake-engine measures unpaced raw writes only")
        pieces = -(-len(data) // chunk_bytes)
        cpu, receiver_cpu, start = cpu_seconds(), cpu_seconds(self.process.pid), time.perf_counter()
        inflight: list[int] = []
        for piece in range(pieces + self.DEPTH):
            while len(inflight) >= self.DEPTH or (piece >= pieces and inflight):
                status = self.engine.status(inflight[0])
                if status is WriteStatus.FAILED:
                    raise RuntimeError("a Mooncake write failed")
                if status is WriteStatus.DONE:
                    inflight.pop(0)
                else:
                    time.sleep(50e-6)
            if piece < pieces:
                offset = (piece % self.DEPTH) * chunk_bytes
                length = min(chunk_bytes, len(data) - piece * chunk_bytes)
                inflight.append(self.engine.write(self.session, self.address + offset, self.arena + offset, length))
        elapsed, gigabytes = time.perf_counter() - start, len(data) / 1e9
        return {"gbps": len(data) * 8 / elapsed / 1e9, "sender_cpu_s_per_gb": (cpu_seconds() - cpu) / gigabytes,
                "receiver_cpu_s_per_gb": (cpu_seconds(self.process.pid) - receiver_cpu) / gigabytes}

    def close(self) -> None:
        self.engine.close()
        if self.process.is_alive():
            os.kill(self.process.pid, 9)
        self.process.join(timeout=30)


def receive(variant: str, max_payload: int, runs, results) -> None:
    """Receiver process: for each run announced on ``runs`` as ``(room, bytes, mode)``, report
    ``(room, first_s, last_s, bytes, first_chunk_bytes, cpu_s)`` on ``results``."""
    listener = make_listener(variant, max_payload)
    results.put(listener.endpoint)
    announced: dict[int, tuple[int, str]] = {}
    current = None
    while True:
        parts = listener.recv(1.0)
        if parts is None:
            continue
        now = time.perf_counter()
        room = peek_room(parts)
        while room not in announced:
            got_room, size, mode = runs.get(timeout=60)
            announced[got_room] = (size, mode)
        size, mode = announced[room]
        if current is None or current["room"] != room:
            current = {"room": room, "first": now, "bytes": 0, "first_bytes": None, "cpu": cpu_seconds(),
                       "assembly": RequestAssembly(room, {STREAM: size}) if mode == "frames" else None}
        if mode == "frames":
            header, payload = decode_frame(parts, KEY, max_payload)
            current["assembly"].accept(header, payload)
            length = header.length
        else:
            length = len(parts[1])
        current["bytes"] += length
        current["first_bytes"] = length if current["first_bytes"] is None else current["first_bytes"]
        if current["bytes"] == size:
            results.put((room, current["first"], now, size, current["first_bytes"], cpu_seconds() - current["cpu"]))
            del announced[room]
            current = None


class Peer:
    """One variant: its receiver process and the sending transport."""

    def __init__(self, variant: str, max_payload: int, context) -> None:
        self.variant = variant
        self.runs, self.results = context.Queue(), context.Queue()
        self.process = context.Process(target=receive, args=(variant, max_payload, self.runs, self.results),
                                       daemon=True)
        self.process.start()
        self.endpoint = self.results.get(timeout=120)
        self.transport = make_transport(variant, max_payload)

    def run(self, room: int, data: bytes, mode: str, chunk_bytes: int, rate_gbps: float) -> dict:
        """Send ``data`` once; the achieved Gbps and CPU seconds per GB on both sides."""
        self.runs.put((room, len(data), mode))
        pacer = make_pacer(rate_gbps, chunk_bytes)
        with PrioritySender(self.transport, KEY, chunk_bytes, pacer=pacer, max_inflight_bytes=len(data)) as sender:
            sender.submit(self.endpoint, room, STREAM, data)
            cpu, start = cpu_seconds(), time.perf_counter()
            got_room, first, last, nbytes, first_bytes, receiver_cpu = self.results.get(timeout=600)
            sender_cpu = cpu_seconds() - cpu
        if got_room != room or nbytes != len(data) or last <= first:
            raise RuntimeError(f"{self.variant}: receiver reported room {got_room}, {nbytes} bytes, {last - first} s")
        gigabytes = len(data) / 1e9
        gbps = (nbytes - first_bytes) * 8 / (last - first) / 1e9 if rate_gbps else nbytes * 8 / (last - start) / 1e9
        return {"gbps": gbps,
                "sender_cpu_s_per_gb": sender_cpu / gigabytes, "receiver_cpu_s_per_gb": receiver_cpu / gigabytes}

    def close(self) -> None:
        self.transport.close()
        if self.process.is_alive():
            os.kill(self.process.pid, 9)
        self.process.join(timeout=30)


def byte_costs(total_bytes: int, chunk_bytes: int) -> dict:
    """CPU seconds per GB of what a receiver does per byte, in ``chunk_bytes`` pieces: the frame MAC
    (keyed BLAKE2b-128), a copy into a warm buffer, a copy out into new ``bytes`` (a listener's copy-out),
    and a copy into a fresh buffer of ``total_bytes`` (``RequestAssembly.accept``: first touch of every page)."""
    data = np.frombuffer(os.urandom(chunk_bytes), dtype=np.uint8)
    warm = np.empty_like(data)
    rounds = max(1, total_bytes // chunk_bytes)

    def cost(step) -> float:
        start = time.process_time()
        for index in range(rounds):
            step(index)
        return (time.process_time() - start) / (rounds * chunk_bytes / 1e9)

    fresh = np.empty(rounds * chunk_bytes, dtype=np.uint8)
    return {
        "blake2b_s_per_gb": cost(lambda index: hashlib.blake2b(data, digest_size=16, key=KEY).digest()),
        "memcpy_warm_s_per_gb": cost(lambda index: np.copyto(warm, data)),
        "copy_out_bytes_s_per_gb": cost(lambda index: data.tobytes()),
        "copy_first_touch_s_per_gb": cost(
            lambda index: np.copyto(fresh[index * chunk_bytes : (index + 1) * chunk_bytes], data)),
    }


def mooncake_version() -> str | None:
    try:
        return importlib.metadata.version("mooncake-transfer-engine-non-cuda")
    except importlib.metadata.PackageNotFoundError:
        return None


def median_row(samples: list[dict]) -> dict:
    return {key: statistics.median(sample[key] for sample in samples) for key in samples[0]}


def unpaced_rows(unpaced: dict[tuple, list[dict]]) -> list[dict]:
    """One row per (variant, bytes, chunk bytes, mode) of ``unpaced`` (its samples, as ``Peer.run``
    returns them): the medians, the samples, and the median Gbit/s over ``zmq``'s and ``zmq-curve``'s
    at the same cell (None where that variant did not run)."""
    rows = []
    for (variant, size, chunk, mode), samples in unpaced.items():
        row = {"variant": variant, "mib": size / (1 << 20), "chunk_kib": chunk // 1024, "mode": mode,
               **median_row(samples), "samples": samples}
        for name in ("zmq", "zmq-curve"):
            baseline = unpaced.get((name, size, chunk, mode))
            row[f"ratio_to_{name}"] = row["gbps"] / median_row(baseline)["gbps"] if baseline else None
        rows.append(row)
    return rows


def paced_rows(paced: dict[tuple, list[dict]]) -> list[dict]:
    """One row per (variant, set Gbit/s) of ``paced``: the medians, the samples, achieved / set rate."""
    rows = []
    for (variant, rate), samples in paced.items():
        row = {"variant": variant, "set_gbps": rate, **median_row(samples), "samples": samples}
        row["ratio"] = row["gbps"] / rate
        rows.append(row)
    return rows


def document(config: dict, costs: dict, unpaced: list[dict], paced: list[dict]) -> dict:
    """What ``--json`` writes: the run's date and commit, ``config``, ``byte_costs``, the rows."""
    stamp = {"date": time.strftime("%Y-%m-%d"), "commit": provenance.commit(Path(__file__).parent)}
    return {**stamp, "config": config, "byte_costs": costs, "unpaced": unpaced, "paced": paced}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated, from {VARIANTS}")
    parser.add_argument("--sizes-mib", default="16,64,256", help="unpaced run sizes, MiB (default 16,64,256)")
    parser.add_argument("--chunks-kib", default="1024,4096", help="chunk payload sizes, KiB (default 1024,4096)")
    parser.add_argument("--modes", default="raw,frames", help="receive modes: raw, frames (default both)")
    parser.add_argument("--rates-gbps", default="0.5,1,2,4", help="paced set rates (default 0.5,1,2,4; '' skips)")
    parser.add_argument("--paced-mib", type=float, default=64.0, help="MiB per paced run (default 64)")
    parser.add_argument("--repeats", type=int, default=3, help="runs per cell; medians reported (default 3)")
    parser.add_argument("--json", default=None, help="write config and every sample to this path")
    args = parser.parse_args()
    variants = [name for name in args.variants.split(",") if name]
    sizes = [int(float(size) * (1 << 20)) for size in args.sizes_mib.split(",") if size]
    chunks = [int(chunk) * 1024 for chunk in args.chunks_kib.split(",") if chunk]
    modes = [mode for mode in args.modes.split(",") if mode]
    rates = [float(rate) for rate in args.rates_gbps.split(",") if rate.strip()]
    if (not set(variants) <= set(VARIANTS) or not set(modes) <= {"raw", "frames"} or args.repeats < 1
            or not sizes or not chunks or min(sizes + chunks) <= 0 or any(rate <= 0 for rate in rates)):
        parser.error("bad --variants, --modes, --sizes-mib, --chunks-kib, --rates-gbps or --repeats")
    max_payload = max(chunks)
    data = os.urandom(max(sizes + [int(args.paced_mib * (1 << 20))]))

    print("measuring per-byte CPU costs", file=sys.stderr, flush=True)
    costs = byte_costs(COST_TOTAL_BYTES, COST_PIECE_BYTES)
    context = multiprocessing.get_context("spawn")
    peers = {}
    unpaced: dict[tuple, list] = {}
    paced: dict[tuple, list] = {}
    try:
        for variant in variants:
            print(f"starting {variant}", file=sys.stderr, flush=True)
            if variant == "mooncake-engine":
                peers[variant] = EnginePeer(max_payload, context)
            else:
                peers[variant] = Peer(variant, max_payload, context)
            peers[variant].run(0, data[: 4 * min(chunks)], "raw", min(chunks), 0)
        room = 1
        framed = [variant for variant in variants if variant != "mooncake-engine"]
        cells = [(size, chunk, mode, variant) for size in sizes for chunk in chunks for mode in modes
                 for variant in (variants if mode == "raw" else framed)]
        plan = (len(cells) + len(rates) * len(framed)) * args.repeats
        step = 0
        for repeat in range(args.repeats):
            for size, chunk, mode, variant in cells:
                sample = peers[variant].run(room, data[:size], mode, chunk, 0)
                room, step = room + 1, step + 1
                unpaced.setdefault((variant, size, chunk, mode), []).append(sample)
                print(f"[{step}/{plan}] {variant} {size >> 20} MiB {chunk >> 10} KiB {mode} run {repeat + 1}: "
                      f"{sample['gbps']:.2f} Gbps", file=sys.stderr, flush=True)
            for rate in rates:
                for variant in framed:
                    paced_data = data[: int(args.paced_mib * (1 << 20))]
                    sample = peers[variant].run(room, paced_data, "frames", min(chunks), rate)
                    room, step = room + 1, step + 1
                    paced.setdefault((variant, rate), []).append(sample)
                    print(f"[{step}/{plan}] {variant} paced {rate:g} Gbps run {repeat + 1}: {sample['gbps']:.3f} Gbps",
                          file=sys.stderr, flush=True)
    finally:
        for peer in peers.values():
            peer.close()

    print(f"CPU s/GB in 1 MiB pieces: frame MAC (keyed BLAKE2b-128) {costs['blake2b_s_per_gb']:.3f} "
          f"({8 / costs['blake2b_s_per_gb']:.1f} Gbit/s per core); copy into a warm buffer "
          f"{costs['memcpy_warm_s_per_gb']:.3f}; copy out to new bytes {costs['copy_out_bytes_s_per_gb']:.3f}; "
          f"copy into a fresh 1 GiB buffer {costs['copy_first_touch_s_per_gb']:.3f}")
    print(f"\nunpaced, 127.0.0.1, median of {args.repeats} (CPU: process seconds per GB, all threads)")
    print(f"{'variant':>15} {'MiB':>5} {'chunk KiB':>9} {'mode':>6} {'Gbps':>7} {'vs zmq':>7} {'vs curve':>8} "
          f"{'send s/GB':>9} {'recv s/GB':>9}")
    rows = unpaced_rows(unpaced)
    for row in sorted(rows, key=lambda r: (r["mode"], r["mib"], r["chunk_kib"], r["variant"])):
        ratio, curve = (f"{row[key]:.2f}" if row[key] else "-" for key in ("ratio_to_zmq", "ratio_to_zmq-curve"))
        print(f"{row['variant']:>15} {row['mib']:>5g} {row['chunk_kib']:>9} {row['mode']:>6} {row['gbps']:>7.2f} "
              f"{ratio:>7} {curve:>8} {row['sender_cpu_s_per_gb']:>9.2f} {row['receiver_cpu_s_per_gb']:>9.2f}")
    paced_table = paced_rows(paced)
    if paced_table:
        print(f"\npaced ({args.paced_mib:g} MiB, {min(chunks) >> 10} KiB chunks, frames mode), median of "
              f"{args.repeats}")
        print(f"{'variant':>15} {'set Gbps':>9} {'got Gbps':>9} {'ratio':>7}")
        for row in paced_table:
            print(f"{row['variant']:>15} {row['set_gbps']:>9g} {row['gbps']:>9.3f} {row['ratio']:>7.3f}")
    if args.json:
        config = {"variants": variants, "sizes": sizes, "chunks": chunks, "modes": modes, "rates_gbps": rates,
                  "paced_mib": args.paced_mib, "repeats": args.repeats, "cost_total_bytes": COST_TOTAL_BYTES,
                  "cost_piece_bytes": COST_PIECE_BYTES, "cpu_count": os.cpu_count(),
                  "loadavg_at_end": os.getloadavg(), "python": platform.python_version(),
                  "pyzmq": zmq.__version__, "libzmq": zmq.zmq_version(), "mooncake": mooncake_version()}
        with open(args.json, "w") as handle:
            json.dump(document(config, costs, rows, paced_table), handle, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
