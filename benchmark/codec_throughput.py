"""Encode and decode throughput of the reference codec on this CPU, beside a plain copy.

For each shape ``TOKENSxHEADSxDIM`` (one layer's K and V, bf16) and each
preset, times ``encode``, ``decode`` (anchor only and every stream), and the
server's pool path: ``gather_encode`` from a token-indexed pool and
``scatter_decode`` into one, at a random permutation of slots. In the same run
it times a plain copy of the same bytes (``Tensor.clone`` of K and V) and an
index gather from the pool (``pool[slots]``), the floor any codec pays.

Throughput is GB/s of bf16 input: the bytes of K+V in bf16 (``2 * T * H * D *
2``) over the median seconds of ``--repeats`` runs after ``--warmup`` runs.
"vs copy" is the op's throughput over the copy's. Progress goes to stderr, a
table to stdout, every sample to ``--json`` (with the 1-minute load average
before and after the runs: the figures are only as good as the machine is quiet).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

from lynx.codec import CodecSpec, decode, encode, gather_encode, scatter_decode, select_backend

DEFAULT_JSON = Path(__file__).resolve().parents[1] / "results" / "codec_throughput.json"
DEFAULT_SHAPES = "4096x8x128,4096x3x64"


def parse_shape(text: str) -> tuple[int, int, int]:
    """``"4096x8x128"`` -> ``(4096, 8, 128)`` (tokens, kv_heads, head_dim)."""
    parts = text.lower().split("x")
    if len(parts) != 3 or not all(part.strip().isdigit() and int(part) > 0 for part in parts):
        raise argparse.ArgumentTypeError(f"shape must be TOKENSxHEADSxDIM of positive ints, got {text!r}")
    tokens, heads, dim = (int(part) for part in parts)
    return tokens, heads, dim


def time_op(fn: Callable[[], object], warmup: int, repeats: int) -> list[float]:
    """Seconds of each of ``repeats`` calls of ``fn`` after ``warmup`` untimed calls."""
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return samples


def plan_shape(shape: tuple[int, int, int], presets: list[str], pool_factor: int, seed: int) -> list[tuple]:
    """``(op, preset, backend, fn)`` for every measurement of one shape, baselines first."""
    tokens, heads, dim = shape
    generator = torch.Generator().manual_seed(seed)
    key = torch.randn(tokens, heads, dim, generator=generator).to(torch.bfloat16)
    value = torch.randn(tokens, heads, dim, generator=generator).to(torch.bfloat16)
    pool_size = pool_factor * tokens
    k_pool = torch.randn(pool_size, heads, dim, generator=generator).to(torch.bfloat16)
    v_pool = torch.randn(pool_size, heads, dim, generator=generator).to(torch.bfloat16)
    slots = torch.randperm(pool_size, generator=generator)[:tokens]
    k_out, v_out = torch.zeros_like(k_pool), torch.zeros_like(v_pool)
    plan = [
        ("copy (clone)", "-", "-", lambda: (key.clone(), value.clone())),
        ("gather pool[slots]", "-", "-", lambda: (k_pool[slots], v_pool[slots])),
    ]
    for name in presets:
        spec = CodecSpec.preset(name)
        encoded = encode(key, value, spec)
        pooled = gather_encode(k_pool, v_pool, slots, spec)
        backend = select_backend("auto", k_pool, spec)
        stage_counts = sorted({1, spec.num_stages})
        plan.append(("encode", name, "reference", lambda spec=spec: encode(key, value, spec)))
        for count in stage_counts:
            label = f"decode {count}/{spec.num_stages}"
            plan.append((label, name, "reference", lambda enc=encoded, n=count: decode(enc, n)))
        plan.append(("gather_encode", name, backend, lambda spec=spec: gather_encode(k_pool, v_pool, slots, spec)))
        for count in stage_counts:
            label = f"scatter_decode {count}/{spec.num_stages}"
            plan.append((label, name, backend, lambda enc=pooled, n=count: scatter_decode(enc, k_out, v_out, slots, n)))
    return plan


def measure_shape(shape: tuple[int, int, int], args: argparse.Namespace) -> dict:
    """Run every op of one shape; returns the shape's JSON record."""
    tokens, heads, dim = shape
    nbytes = 2 * tokens * heads * dim * 2
    plan = plan_shape(shape, args.presets, args.pool_factor, args.seed)
    rows = []
    for step, (op, preset, backend, fn) in enumerate(plan, 1):
        samples = time_op(fn, args.warmup, args.repeats)
        median = statistics.median(samples)
        rows.append({"op": op, "preset": preset, "backend": backend, "samples_s": samples,
                     "median_s": median, "gb_per_s": nbytes / median / 1e9})
        print(f"[{tokens}x{heads}x{dim} {step}/{len(plan)}] {op} {preset}: {median * 1e3:.2f} ms",
              file=sys.stderr, flush=True)
    copy_rate = rows[0]["gb_per_s"]
    for row in rows:
        row["vs_copy"] = row["gb_per_s"] / copy_rate
    return {"tokens": tokens, "kv_heads": heads, "head_dim": dim, "bf16_bytes": nbytes, "rows": rows}


def print_table(record: dict, threads: int, repeats: int) -> None:
    mib = record["bf16_bytes"] / (1 << 20)
    print(f"\nshape {record['tokens']} tokens x {record['kv_heads']} kv heads x {record['head_dim']} head_dim "
          f"({mib:.2f} MiB of bf16 K+V), {threads} thread(s), median of {repeats}")
    print(f"{'op':<20} {'preset':<11} {'backend':<10} {'median ms':>10} {'GB/s':>9} {'vs copy':>9}")
    for row in record["rows"]:
        print(f"{row['op']:<20} {row['preset']:<11} {row['backend']:<10} {row['median_s'] * 1e3:>10.2f} "
              f"{row['gb_per_s']:>9.3f} {row['vs_copy']:>9.4f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", default=DEFAULT_SHAPES,
                        help=f"comma-separated TOKENSxHEADSxDIM per layer (default {DEFAULT_SHAPES})")
    parser.add_argument("--presets", default=",".join(CodecSpec.preset_names()),
                        help="comma-separated codec presets (default: all)")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs per op; the median is reported (default 5)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed runs per op before timing (default 1)")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch intra-op threads (default: torch's, which follows OMP_NUM_THREADS)")
    parser.add_argument("--pool-factor", type=int, default=2,
                        help="pool slots per request token for the pool ops (default 2)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random inputs and slots (default 0)")
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON,
                        help="write config and every sample here (default results/codec_throughput.json)")
    args = parser.parse_args(argv)
    try:
        shapes = [parse_shape(text) for text in args.shapes.split(",") if text.strip()]
    except argparse.ArgumentTypeError as exc:
        parser.error(str(exc))
    args.presets = [name.strip() for name in args.presets.split(",") if name.strip()]
    unknown = [name for name in args.presets if name not in CodecSpec.preset_names()]
    if unknown or not args.presets or not shapes:
        parser.error(f"need at least one shape and preset; valid presets: {', '.join(CodecSpec.preset_names())}")
    if args.repeats < 1 or args.warmup < 0 or args.pool_factor < 1 or (args.threads is not None and args.threads < 1):
        parser.error("--repeats, --pool-factor and --threads must be positive, --warmup non-negative")
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    threads = torch.get_num_threads()

    load_before = os.getloadavg()[0]
    records = [measure_shape(shape, args) for shape in shapes]
    load_after = os.getloadavg()[0]
    for record in records:
        print_table(record, threads, args.repeats)
    config = {
        "date": datetime.date.today().isoformat(), "threads": threads, "repeats": args.repeats,
        "warmup": args.warmup, "pool_factor": args.pool_factor, "seed": args.seed, "presets": args.presets,
        "input_dtype": "bfloat16", "torch": torch.__version__, "python": platform.python_version(),
        "machine": platform.machine(), "processor": _cpu_name(), "cpus": os.cpu_count(),
        "load_average": [load_before, load_after],
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"config": config, "shapes": records}, indent=2))
    print(f"wrote {args.json}", file=sys.stderr)
    return 0


def _cpu_name() -> str:
    """The CPU model name from /proc/cpuinfo where there is one, else ``platform.processor()``."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


if __name__ == "__main__":
    sys.exit(main())
