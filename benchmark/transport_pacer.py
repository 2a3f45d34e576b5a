"""Achieved rate of PrioritySender + ZmqTransport against the token-bucket pacer's set rate.

Sends ``--mib`` MiB as one stream to a receiver in a separate process over
TCP on 127.0.0.1 (frames are MAC-checked and reassembled there, as in
serving), at each set link rate and unpaced, ``--repeats`` times each.
The achieved rate is measured at the receiver from arrival times: the bytes
after the first chunk divided by (last arrival - first arrival), so the
first chunk, which the full bucket lets go at once, does not inflate it.
Progress goes to stderr, a table to stdout, and ``--json PATH`` writes all
samples.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import statistics
import sys
import time

import zmq

from lynx.transfer.frames import decode_frame
from lynx.transfer.pacer import make_pacer
from lynx.transfer.reassembly import RequestAssembly
from lynx.transfer.sender import PrioritySender
from lynx.transfer.zmq_transport import ZmqListener, ZmqTransport

KEY = b"transport-pacer-benchmark"
STREAM = 1


def receive(key: bytes, max_payload: int, sizes, results) -> None:
    """Receiver process: for each room announced on ``sizes`` as ``(room, bytes)``,
    reassemble it and put ``(room, first_arrival_s, last_arrival_s, bytes, first_chunk_bytes)``
    on ``results``.
    """
    expected: dict[int, RequestAssembly] = {}
    arrivals: dict[int, list] = {}
    with ZmqListener(max_message_bytes=max_payload + 64) as listener:
        results.put(listener.endpoint)
        while True:
            parts = listener.recv(1.0)
            if parts is None:
                continue
            now = time.perf_counter()
            header, payload = decode_frame(parts, key, max_payload)
            while header.room not in expected:
                room, size = sizes.get(timeout=60)
                expected[room] = RequestAssembly(room, {STREAM: size})
            assembly = expected[header.room]
            record = arrivals.setdefault(header.room, [now, now, 0, header.length])
            record[1] = now
            record[2] += header.length
            if assembly.accept(header, payload):
                results.put((header.room, *arrivals.pop(header.room)))
                del expected[header.room]


def run_once(transport, endpoint, room, data, rate_gbps, chunk_bytes, burst_bytes, sizes, results) -> float:
    """Send ``data`` once; return the achieved rate in Gbps (measured at the receiver)."""
    sizes.put((room, len(data)))
    pacer = make_pacer(rate_gbps, burst_bytes)
    with PrioritySender(transport, KEY, chunk_bytes, pacer=pacer, max_inflight_bytes=max(len(data), 1)) as sender:
        sender.submit(endpoint, room, STREAM, data)
        got_room, first, last, nbytes, first_bytes = results.get(timeout=600)
    if got_room != room or nbytes != len(data):
        raise RuntimeError(f"receiver reported room {got_room} with {nbytes} bytes, not room {room}, {len(data)}")
    if last <= first:
        raise RuntimeError("all chunks arrived at once; use more MiB or smaller chunks")
    return (nbytes - first_bytes) * 8 / (last - first) / 1e9


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mib", type=float, default=64.0, help="MiB sent per run (default 64)")
    parser.add_argument("--rates-gbps", default="0.1,0.5,1,2", help="comma-separated set rates (default 0.1,0.5,1,2)")
    parser.add_argument("--repeats", type=int, default=3, help="runs per rate; the median is reported (default 3)")
    parser.add_argument("--chunk-kib", type=int, default=1024, help="chunk payload size, KiB (default 1024)")
    parser.add_argument("--burst-kib", type=int, default=None, help="token-bucket depth, KiB (default: one chunk)")
    parser.add_argument("--json", default=None, help="write config and every sample to this path")
    args = parser.parse_args()
    rates = [float(rate) for rate in args.rates_gbps.split(",") if rate.strip()]
    if args.mib <= 0 or args.repeats < 1 or args.chunk_kib < 1 or any(rate <= 0 for rate in rates):
        parser.error("--mib, --repeats, --chunk-kib and every rate must be positive")
    chunk_bytes = args.chunk_kib * 1024
    burst_bytes = (args.burst_kib if args.burst_kib is not None else args.chunk_kib) * 1024
    data = os.urandom(int(args.mib * (1 << 20)))

    context = multiprocessing.get_context("spawn")
    sizes, results = context.Queue(), context.Queue()
    receiver = context.Process(target=receive, args=(KEY, chunk_bytes, sizes, results), daemon=True)
    receiver.start()
    rows = []
    try:
        endpoint = results.get(timeout=120)
        with ZmqTransport(send_timeout_s=60) as transport:
            run_once(transport, endpoint, 0, data[: 4 * chunk_bytes], 0, chunk_bytes, burst_bytes, sizes, results)
            plan = [*rates, 0.0]
            room = 1
            for step, rate in enumerate(plan, 1):
                samples = []
                for repeat in range(args.repeats):
                    args_once = (transport, endpoint, room, data, rate, chunk_bytes, burst_bytes, sizes, results)
                    samples.append(run_once(*args_once))
                    room += 1
                    label = f"{rate:g} Gbps" if rate else "unpaced"
                    print(f"[{step}/{len(plan)}] {label} run {repeat + 1}/{args.repeats}: {samples[-1]:.4f} Gbps",
                          file=sys.stderr, flush=True)
                median = statistics.median(samples)
                rows.append({"set_gbps": rate or None, "samples_gbps": samples, "median_gbps": median,
                             "ratio": median / rate if rate else None})
    finally:
        if receiver.is_alive():
            os.kill(receiver.pid, 9)
        receiver.join(timeout=30)

    print(f"{args.mib:g} MiB per run, {args.chunk_kib} KiB chunks, burst {burst_bytes // 1024} KiB, "
          f"{args.repeats} runs per rate, 127.0.0.1 TCP, receiver in a separate process")
    print(f"{'set Gbps':>10} {'median Gbps':>12} {'ratio':>8} {'min Gbps':>10} {'max Gbps':>10}")
    for row in rows:
        set_label = f"{row['set_gbps']:g}" if row["set_gbps"] else "unpaced"
        ratio = f"{row['ratio']:.4f}" if row["ratio"] is not None else "-"
        print(f"{set_label:>10} {row['median_gbps']:>12.4f} {ratio:>8} "
              f"{min(row['samples_gbps']):>10.4f} {max(row['samples_gbps']):>10.4f}")
    if args.json:
        config = {"mib": args.mib, "chunk_bytes": chunk_bytes, "burst_bytes": burst_bytes, "repeats": args.repeats,
                  "cpu_count": os.cpu_count(), "python": platform.python_version(), "pyzmq": zmq.__version__,
                  "libzmq": zmq.zmq_version()}
        with open(args.json, "w") as handle:
            json.dump({"config": config, "results": rows}, handle, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
