"""Check on a CUDA GPU that the decode side writes a request's anchor, then upgrades it with the residual, exactly.

Lynx's own decode side (`DecodeSide`: the signed manifest, frame MACs,
reassembly, the anchor write as its data thread makes it, `apply_residual` as
the scheduler thread calls it between forward passes) receives the messages a
prefill rank sends for one request, encoded on the CPU from a random bf16 pool,
into a bf16 pool on the GPU. The messages are handed to the side's message
handler as its data thread does after a socket receive (no sockets, no SGLang).

Checked, per preset and repeat:

* the anchor: once the anchor's frames are in, success is reported and the
  request's slots equal the CPU decode of the anchor alone, bit for bit;
* the upgrade: once the residual is in and `apply_residual` returns True,
  the slots equal the CPU decode of every stream, bit for bit;
* nothing else: every slot outside the request is unchanged;
* the control: the anchor alone decodes to other values than every stream
  (so the two exactness checks tell the stages apart; reported, exit status
  unaffected).

Timed (medians over the repeats): the anchor write (from the last anchor frame
handed over to its success) and `apply_residual`. `--device cpu` runs the same
checks on a CPU pool (a dry run of this script, not a GPU result).

Needs torch, numpy, pyzmq and this repository (no SGLang):

    PYTHONPATH=python:.:test/support python scripts/gpu_check_decode_upgrade.py --json decode_upgrade.json

Exit status: 0 all checks passed, 1 a check failed, 2 nothing was checked (no CUDA GPU).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from types import SimpleNamespace

import torch
from lynx.transfer.frames import AUX_STREAM
from pd_fakes import AUX_LENS, SECRET, DecodeHost, FakePool, config, transfer_messages

EXIT_FAILED = 1
EXIT_NO_GPU = 2
ROOM, AUX_INDEX = 77, 1
CHECKS = ("anchor_ok", "anchor_exact", "upgraded", "upgrade_exact", "untouched")


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], epilog="Exit status: 0 ok, 1 a check failed, 2 no GPU (nothing checked)."
    )
    parser.add_argument("--tokens", type=int, default=8192, help="tokens of the request (default 8192)")
    parser.add_argument("--layers", type=int, default=32, help="layers (default 32)")
    parser.add_argument("--heads", type=int, default=8, help="kv heads (default 8)")
    parser.add_argument("--head-dim", type=int, default=128, help="head dim (default 128)")
    parser.add_argument("--presets", default="int8,bf16-exact", help="lynx-mode presets to check (default int8,bf16-exact)")
    parser.add_argument("--repeats", type=int, default=3, help="requests per preset (default 3)")
    parser.add_argument("--chunk-bytes", type=int, default=1 << 20, help="--lynx-chunk-bytes (default 1 MiB)")
    parser.add_argument("--device", default="cuda", help="the pool's device (default cuda; cpu: a dry run)")
    parser.add_argument("--json", metavar="PATH", help="write results as JSON here")
    return parser.parse_args(argv)


def make_pool(args, device: str, seed: int, slots: int) -> FakePool:
    """Per-layer bf16 K/V of `slots` tokens of the checked shape on `device`, with metadata rows."""
    return FakePool(seed, slots, layers=args.layers, heads=args.heads, head_dim=args.head_dim, device=device)


def reference(cfg, source, src: torch.Tensor, target_cpu, dst: torch.Tensor, streams_used: int) -> list[torch.Tensor]:
    """The request's slots after decoding its first `streams_used` streams into a CPU copy of the target."""
    k = [t.clone() for t in target_cpu.k]
    v = [t.clone() for t in target_cpu.v]
    streams = cfg.wire.encode(source.k, source.v, src)
    cfg.wire.write(streams[:streams_used], source.view.shape(len(src)), k, v, dst)
    return [t[dst] for t in k + v]


def one_request(args, cfg, source, target, target_cpu, seed: int) -> dict:
    """Send one request's messages into `target`, check both stages, time them."""
    from lynx.transfer.keys import transfer_key

    from lynx.pd.decode_side import DecodeSide

    slots = target.k[0].shape[0]
    generator = torch.Generator().manual_seed(seed)
    src = torch.randperm(source.k[0].shape[0], generator=generator)[: args.tokens]
    dst = torch.randperm(slots, generator=generator)[: args.tokens]
    anchor_only = reference(cfg, source, src, target_cpu, dst, 1)
    every_stream = reference(cfg, source, src, target_cpu, dst, cfg.wire.num_streams)

    def request_slots_equal(expected) -> bool:
        return all(torch.equal(t[dst.to(t.device)].to("cpu"), e) for t, e in zip(target.k + target.v, expected))

    host = DecodeHost()
    side = DecodeSide(cfg, SECRET, host, "127.0.0.1")
    try:
        side.attach(target.view)
        assert side.claim(ROOM)
        nonce = side.reserve(ROOM, dst.numpy(), AUX_INDEX, time.monotonic(), "prefill-a", ("tcp://127.0.0.1:9",))
        key = transfer_key(SECRET, nonce)
        manifest, frames = transfer_messages(cfg, source, src.tolist(), ROOM, key, bytes(sum(AUX_LENS)))
        side._on_message(manifest.seal(key))
        anchor = [*frames[AUX_STREAM], *frames[0]]
        for parts in anchor[:-1]:
            side._on_message(parts)
        started = time.perf_counter()
        side._on_message(anchor[-1])
        anchor_s = time.perf_counter() - started
        anchor_ok, anchor_exact = host.succeeded == [ROOM] and not host.failures, request_slots_equal(anchor_only)
        for stream in range(1, cfg.wire.num_streams):
            for parts in frames[stream]:
                side._on_message(parts)
        started = time.perf_counter()
        upgraded = side.apply_residual(ROOM)
        upgrade_s = time.perf_counter() - started
        outside = torch.ones(slots, dtype=torch.bool)
        outside[dst] = False
        untouched = all(torch.equal(t.to("cpu")[outside], b[outside]) for t, b in zip(target.k + target.v, target_cpu.k + target_cpu.v))
        return {"anchor_ok": anchor_ok, "anchor_exact": anchor_exact, "upgraded": upgraded,
                "upgrade_exact": request_slots_equal(every_stream), "untouched": untouched,
                "control": not all(torch.equal(a, b) for a, b in zip(anchor_only, every_stream)),
                "failures": host.failures, "anchor_s": anchor_s, "upgrade_s": upgrade_s}  # fmt: skip
    finally:
        side.forget(ROOM)
        side.close()


def check(args) -> dict:
    """Per preset: every check over the repeats (all must hold), the control, the medians."""
    source = make_pool(args, "cpu", 0, 2 * args.tokens)
    results = {}
    for preset in args.presets.split(","):
        cfg = config(mode="lynx", preset=preset, chunk_bytes=args.chunk_bytes)
        target = make_pool(args, args.device, 1, 2 * args.tokens)
        runs = []
        for repeat in range(args.repeats):
            target_cpu = SimpleNamespace(k=[t.to("cpu") for t in target.k], v=[t.to("cpu") for t in target.v])
            runs.append(one_request(args, cfg, source, target, target_cpu, seed=100 + repeat))
            print(f"{preset} repeat {repeat}: {runs[-1]}", file=sys.stderr)
        results[preset] = {
            **{name: all(r[name] for r in runs) for name in CHECKS},
            "control_stages_differ": all(r["control"] for r in runs),
            "failures": [f for r in runs for f in r["failures"]],
            "anchor_write_s": statistics.median(r["anchor_s"] for r in runs),
            "upgrade_s": statistics.median(r["upgrade_s"] for r in runs),
        }
    return results


def main(argv=None) -> int:
    args = parse_args(argv)
    on_gpu = args.device.startswith("cuda")
    if on_gpu and not torch.cuda.is_available():
        print("no CUDA GPU visible; nothing checked", file=sys.stderr)
        return EXIT_NO_GPU
    results = check(args)
    shape = {"tokens": args.tokens, "layers": args.layers, "heads": args.heads, "head_dim": args.head_dim}
    report = {"device": torch.cuda.get_device_name() if on_gpu else "cpu (dry run)", "torch": torch.__version__,
              **shape, "repeats": args.repeats, "presets": results}  # fmt: skip
    passed = {preset: all(r[name] for name in CHECKS) for preset, r in results.items()}
    for preset, r in results.items():
        print(f"{preset}: {'ok' if passed[preset] else 'FAILED'}; anchor write {r['anchor_write_s'] * 1e3:.1f} ms, "
              f"apply_residual {r['upgrade_s'] * 1e3:.1f} ms ({args.tokens} tokens, {args.layers} layers); "
              f"control: the stages differ {r['control_stages_differ']}")  # fmt: skip
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return 0 if all(passed.values()) else EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
