"""Check on a CUDA GPU that a prefill forward's segments leave layer by layer, exactly and while it runs.

A stand-in forward writes each layer's K and V of one request into a bf16 pool
on the GPU, each after a device spin of `--layer-ms`, and reports each layer to
Lynx's `ForwardLayers` the way the `set_kv_buffer` hook does on a prefill
server: when the write is queued, not done. Lynx's own prefill side (encoder
thread, device marks, priority sender; a transport that records instead of
sending) streams the request's segments as the layers are written. The
forward runs on the default stream (SGLang without the overlap schedule) and
on a stream of its own (with it).

Checked, per mode and forward stream:

* exactness: the messages sent equal, byte for byte, those of a whole send
  after the forward (what the prefill does where layers do not stream);
* overlap: the first KV frame leaves before the forward ends on the device;
* the control: with the device marks taken away (the CPU platform's
  assumption that a reported write is done) the frames differ, which shows
  the exactness check can fail (reported; exit status unaffected).

Needs torch, numpy, pyzmq and this repository (no SGLang):

    PYTHONPATH=python:.:test/support python scripts/gpu_check_layer_streaming.py --json streaming.json

Exit status: 0 all checks passed, 1 a check failed, 2 nothing was checked (no CUDA GPU).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import statistics
import sys
import time

import numpy as np
import torch
from gpu_check_kernels import print_table
from pd_fakes import Recorder

TIMES = {  # medians over the streamed runs, from the forward's first launch
    "forward_queued_s": "forward queued",
    "forward_s": "forward done",
    "first_kv_frame_s": "first KV frame",
    "last_kv_frame_s": "last KV frame",
}
EXIT_FAILED = 1
EXIT_NO_GPU = 2
ROOM, AUX_INDEX = 9, 2


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], epilog="Exit status: 0 ok, 1 a check failed, 2 no GPU (nothing checked)."
    )
    parser.add_argument("--tokens", type=int, default=2048, help="tokens of the request (default 2048)")
    parser.add_argument("--layers", type=int, default=32, help="layers (default 32)")
    parser.add_argument("--heads", type=int, default=8, help="kv heads (default 8)")
    parser.add_argument("--head-dim", type=int, default=128, help="head dim (default 128)")
    parser.add_argument("--segment-tokens", type=int, default=512, help="--lynx-segment-tokens (default 512)")
    parser.add_argument("--layer-ms", type=float, default=5.0, help="device time of one stand-in layer (default 5)")
    parser.add_argument("--modes", default="int8,lynx,bf16", help="Lynx modes to check (default int8,lynx,bf16)")
    parser.add_argument("--repeats", type=int, default=3, help="streamed runs per mode and stream (default 3)")
    parser.add_argument("--json", metavar="PATH", help="write results as JSON here")
    return parser.parse_args()


class TimedRecorder(Recorder):
    """A transport that keeps every message with the time it was handed over (`time.perf_counter`)."""

    def send(self, endpoint, parts) -> None:
        self.sent.append((time.perf_counter(), [bytes(p) for p in parts]))

    def kv_times(self) -> list[float]:
        """When each KV frame (stream 0 or above; not metadata, manifests or alive messages) left."""
        from lynx.transfer.frames import AUX_STREAM, HEADER_BYTES, HEADER_STRUCT

        out = []
        for at, parts in self.sent:
            if len(parts) == 2 and len(parts[0]) == HEADER_BYTES:
                stream = HEADER_STRUCT.unpack(parts[0][: HEADER_STRUCT.size])[3]
                if stream != AUX_STREAM:
                    out.append(at)
        return out

    def messages(self) -> list[bytes]:
        from lynx.transfer.alive import alive_room

        return sorted(b"".join(parts) for _, parts in self.sent if alive_room(parts) is None)


class Request:
    """A bf16 pool on the GPU (twice the request's tokens), the request's slots in it, the KV the
    forward writes there, and the metadata rows a prefill reads."""

    def __init__(self, args: argparse.Namespace) -> None:
        from lynx.heads import HeadShard

        from lynx.pd.pool import PoolView
        from pd_fakes import AUX_LENS

        g = torch.Generator(device="cuda").manual_seed(0)
        shape = (2 * args.tokens, args.heads, args.head_dim)
        self.k = [torch.empty(shape, dtype=torch.bfloat16, device="cuda") for _ in range(args.layers)]
        self.v = [torch.empty(shape, dtype=torch.bfloat16, device="cuda") for _ in range(args.layers)]
        computed = (args.layers, args.tokens, args.heads, args.head_dim)
        self.new_k = (torch.randn(computed, device="cuda", generator=g) * 3).to(torch.bfloat16)
        self.new_v = torch.randn(computed, device="cuda", generator=g).to(torch.bfloat16)
        self.slots = torch.randperm(2 * args.tokens, device="cuda", generator=g)[: args.tokens]
        self.slots_np = self.slots.cpu().numpy().astype(np.int64)
        self.aux_rows = [np.full((4, n), 7, dtype=np.uint8) for n in AUX_LENS]
        ptrs = tuple(row.ctypes.data_as(ctypes.c_void_p).value for row in self.aux_rows)
        self.shard = HeadShard(1, 0, args.heads, args.heads)
        self.view = PoolView(tuple(self.k), tuple(self.v), 1, ptrs, AUX_LENS, self.shard)

    def stale(self) -> None:
        """Fill the pool with what a previous request left (not the forward's KV)."""
        for buffer in self.k + self.v:
            buffer.fill_(-1.5)
        torch.cuda.synchronize()

    def forward(self, layers, stream: torch.cuda.Stream, spin_cycles: int) -> torch.cuda.Event:
        """Queue the stand-in forward on `stream`: per layer a spin, then the KV writes, reported to
        `layers` (if any) as they are queued. Returns an event recorded after the last write."""
        with torch.cuda.stream(stream):
            for layer in range(len(self.k)):
                torch.cuda._sleep(spin_cycles)
                self.k[layer].index_copy_(0, self.slots, self.new_k[layer])
                self.v[layer].index_copy_(0, self.slots, self.new_v[layer])
                if layers is not None:
                    layers.written(layer + 1)
            end = torch.cuda.Event()
            end.record(stream)
        return end


def prefill_side(mode: str, request: Request, args: argparse.Namespace):
    """Lynx's prefill side over the GPU pool, its room claimed for a decode rank, its threads started."""
    from lynx.pd.prefill_side import PrefillSide
    from pd_fakes import AUX_LENS, SECRET, PrefillHost, config, decode_registration, room_metadata

    host = PrefillHost()
    options = {"mode": mode, "segment_tokens": args.segment_tokens, "chunk_bytes": 1 << 20}
    side = PrefillSide(config(**options), SECRET, host, "127.0.0.1")
    side.transport.close()
    side.transport = side.sender._transport = TimedRecorder()
    side.attach(request.view)
    side.on_registration(decode_registration(heads=request.shard), AUX_LENS)
    side.on_metadata(room_metadata(room=ROOM, tokens=len(request.slots_np)))
    if not side.claim(ROOM):
        raise RuntimeError("the room could not be claimed")
    side.start()
    return side, host


def finish_send(side, host, request: Request) -> None:
    """Hand the request's one chunk over as SGLang's sender does after the forward; wait until sent."""
    side.add_chunk(ROOM, request.slots_np, True, AUX_INDEX, len(request.slots_np))
    deadline = time.monotonic() + 120
    while not host.succeeded and not host.failures and time.monotonic() < deadline:
        time.sleep(0.005)
    if host.failures or not host.succeeded or not side.sender.wait_idle(120):
        raise RuntimeError(f"the room was not sent: {host.failures or 'timed out'}")


def whole_send(mode: str, request: Request, args: argparse.Namespace, stream, spin_cycles: int) -> dict:
    """The forward first (nothing streams), then the chunk: what a prefill sends after the forward."""
    request.stale()
    request.forward(None, stream, spin_cycles).synchronize()
    side, host = prefill_side(mode, request, args)
    try:
        start = time.perf_counter()
        finish_send(side, host, request)
        return {"messages": side.transport.messages(), "send_s": time.perf_counter() - start}
    finally:
        side.close()


def streamed_send(mode: str, request: Request, args: argparse.Namespace, stream, spin_cycles: int, marks: bool) -> dict:
    """The segments handed to the side before the forward and streamed as it writes (as in
    `run_batch`); with `marks` False the device marks are taken away (the control)."""
    request.stale()
    side, host = prefill_side(mode, request, args)
    try:
        layers = side.begin_forward([(ROOM, request.slots_np)])
        if layers is None:
            raise RuntimeError("the prefill side does not stream layers from this pool")
        if not marks:
            layers._marks = None
        start = time.perf_counter()
        end = request.forward(layers, stream, spin_cycles)
        queued_s = time.perf_counter() - start
        layers.finish(True)
        while not end.query():
            time.sleep(0.0002)
        forward_s = time.perf_counter() - start
        finish_send(side, host, request)
        kv = side.transport.kv_times()
        return {
            "messages": side.transport.messages(),
            "forward_queued_s": queued_s,
            "forward_s": forward_s,
            "first_kv_frame_s": min(kv) - start,
            "last_kv_frame_s": max(kv) - start,
        }
    finally:
        side.close()


def spin_cycles_for(ms: float) -> int:
    """Cycles of `torch.cuda._sleep` that take about `ms` milliseconds on this GPU."""
    cycles = 10_000_000
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(cycles)
    start.record()
    torch.cuda._sleep(cycles)
    end.record()
    end.synchronize()
    return int(cycles * ms / start.elapsed_time(end))


def main() -> int:
    args = parse_args()
    if not torch.cuda.is_available():
        print("gpu_check_layer_streaming: no CUDA GPU visible; nothing checked (exit 2).", file=sys.stderr)
        return EXIT_NO_GPU
    request = Request(args)
    spin = spin_cycles_for(args.layer_ms)
    streams = {"default": torch.cuda.default_stream(), "own": torch.cuda.Stream()}
    rows, failures = [], []
    for mode in args.modes.split(","):
        for stream_name, stream in streams.items():
            print(f"{mode}, forward on the {stream_name} stream", file=sys.stderr, flush=True)
            whole = whole_send(mode, request, args, stream, spin)
            runs = [streamed_send(mode, request, args, stream, spin, marks=True) for _ in range(args.repeats)]
            control = streamed_send(mode, request, args, stream, spin, marks=False)
            exact = all(run["messages"] == whole["messages"] for run in runs)
            overlap = all(run["first_kv_frame_s"] < run["forward_s"] for run in runs)
            row = {
                "mode": mode,
                "forward stream": stream_name,
                "exact": exact,
                "first frame before forward end": overlap,
                "control differs": control["messages"] != whole["messages"],
                "messages": len(whole["messages"]),
                "MiB": sum(map(len, whole["messages"])) / 2**20,
                **{f"{label} ms": statistics.median(run[key] for run in runs) * 1000 for key, label in TIMES.items()},
                "whole send after forward ms": whole["send_s"] * 1000,
            }
            rows.append(row)
            if not exact:
                failures.append(f"{mode} ({stream_name} stream): streamed messages differ from a whole send")
            if not overlap:
                failures.append(f"{mode} ({stream_name} stream): no KV frame left before the forward ended")
    print_table(rows, digits=1)
    for failure in failures:
        print(f"FAILED {failure}")
    print(f"layer streaming: {'; '.join(failures) if failures else 'exact, and under way before the forward ends'}")
    if args.json:
        result = {
            "device": torch.cuda.get_device_name(),
            "torch": torch.__version__,
            "shape": {"tokens": args.tokens, "layers": args.layers, "kv_heads": args.heads, "head_dim": args.head_dim},
            "segment_tokens": args.segment_tokens,
            "layer_ms": args.layer_ms,
            "repeats": args.repeats,
            "failures": failures,
            "rows": rows,
        }
        with open(args.json, "w") as handle:
            json.dump(result, handle, indent=2)
        print(f"wrote {args.json}")
    return EXIT_FAILED if failures else 0


if __name__ == "__main__":
    sys.exit(main())
