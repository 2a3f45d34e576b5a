"""Check the Lynx Triton pool kernels on a CUDA GPU: exactness first, then bandwidth.

Exactness: for every codec preset, the three-stage spec 2+2+4 and the int8
split without sink tokens, the fused encode must give the reference
``encode_from_pool`` streams byte for byte, and decode (every stage count)
and the residual upgrade must leave pools bit-identical to the reference, on
realistic shapes (bf16, random permuted slots in a larger pool), on edge
values, on a request of fewer tokens than the sink tokens, and against the
CPU reference on a slice.

Division: the reference's ``divide`` must give correctly rounded quotients
on the device (a plain division by a Python scalar is counted beside it).

Bandwidth: medians of CUDA-event timings. Encode is reported as GB/s of bf16
K+V read, decode as GB/s of bf16 K+V written, each beside a plain device copy
(``Tensor.copy_``) and an index gather/scatter of the same bytes measured in
the same run. "kernel" rows time the launches alone; "api" rows include the
checked entry points' validation and host synchronisation.

With ``--tune`` it also times int8 under other tile sizes and warp counts.

Needs only torch, triton and this repository:

    PYTHONPATH=python:kernels python scripts/gpu_check_kernels.py --json gpu_check.json

Exit status: 0 all checks passed, 1 a kernel disagreed with the reference,
2 nothing was checked (no CUDA GPU, or triton missing).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
from collections.abc import Callable

import torch

EXIT_MISMATCH = 1
EXIT_NO_GPU = 2


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], epilog="Exit status: 0 ok, 1 mismatch, 2 no GPU (nothing checked)."
    )
    parser.add_argument("--tokens", type=int, default=32768, help="tokens per request (default 32768)")
    parser.add_argument("--heads", type=int, default=8, help="kv heads (default 8)")
    parser.add_argument("--head-dim", type=int, default=128, help="head dim (default 128)")
    parser.add_argument("--pool-factor", type=int, default=2, help="pool slots per request token (default 2)")
    parser.add_argument("--repeats", type=int, default=20, help="timed repeats per measurement (default 20)")
    parser.add_argument("--cpu-slice", type=int, default=2048, help="tokens compared against the CPU reference")
    parser.add_argument("--json", metavar="PATH", help="write results as JSON here")
    parser.add_argument(
        "--tune", action="store_true",
        help="also time int8 under 3 tile sizes x 3 warp counts, each checked against the default tiles (~1 min)",
    )  # fmt: skip
    return parser.parse_args()


def main() -> int:
    args = parse_args()
    if not torch.cuda.is_available():
        print("gpu_check_kernels: no CUDA GPU visible; nothing checked (exit 2).", file=sys.stderr)
        return EXIT_NO_GPU
    try:
        import triton
        import lynx_kernels  # noqa: F401
        from lynx.codec import CodecSpec
    except ImportError as error:
        message = f"cannot import the kernels ({error}); run with PYTHONPATH=python:kernels and triton installed"
        print(f"gpu_check_kernels: {message} (exit 2).", file=sys.stderr)
        return EXIT_NO_GPU
    specs = {name: CodecSpec.preset(name) for name in CodecSpec.preset_names()}
    extra = {"2+2+4": CodecSpec(stage_bits=(2, 2, 4)), "int8 no sinks": CodecSpec(stage_bits=(4, 4), sink_tokens=0)}
    division = check_division("cuda")
    print(f"division: {division}")
    mismatches = [f"divide by {d}: {n} quotients not correctly rounded" for d, n in division["divide"].items() if n]
    mismatches += check_exactness(args, {**specs, **extra}, "cuda")
    rows = measure_bandwidth(args, specs, "cuda")
    print_table(rows)
    tuning = []
    if args.tune:
        tuning = measure_tiles(args, {"int8": specs["int8"]})
        print_table(tuning)
        mismatches += [f"tiles {row['preset']} {row['tile']}x{row['warps']}: {row['op']} differs" for row in tuning
                       if not row["same"]]  # fmt: skip
    for failure in mismatches:
        print(f"MISMATCH {failure}")
    verdict = f"{len(mismatches)} mismatches" if mismatches else "all kernels bit-identical to the reference"
    print(f"exactness: {verdict}")
    if args.json:
        result = {
            "device": torch.cuda.get_device_name(),
            "torch": torch.__version__,
            "triton": triton.__version__,
            "python": platform.python_version(),
            "shape": {"tokens": args.tokens, "kv_heads": args.heads, "head_dim": args.head_dim},
            "repeats": args.repeats,
            "mismatches": mismatches,
            "division": division,
            "bandwidth": rows,
            "tiles": tuning,
        }
        with open(args.json, "w") as handle:
            json.dump(result, handle, indent=2)
        print(f"wrote {args.json}")
    return EXIT_MISMATCH if mismatches else 0


DIVISORS = (3, 7, 15, 31, 63, 127, 255, 4095, 65535, 5, 9, 17, 33)


def check_division(device: str, count: int = 1 << 22) -> dict:
    """Quotients on `device` that differ from float64 division rounded once to float32 (the
    correctly rounded quotient), per divisor the codec uses (anchor levels ``2^a - 1``, stage cells
    ``2n - 1``): through the reference's ``divide`` (must be 0) and, for comparison, a plain
    division by a Python scalar (which CUDA computes with the scalar's rounded reciprocal)."""
    from lynx.codec.rounding import divide

    generator = torch.Generator(device=device).manual_seed(11)
    scale = torch.exp2(torch.randint(-30, 30, (count,), device=device, generator=generator).float())
    x = torch.randn(count, device=device, generator=generator) * scale
    result = {"values": count, "divide": {}, "scalar": {}}
    for divisor in DIVISORS:
        expected = (x.double() / divisor).float()
        result["divide"][divisor] = int((divide(x, divisor) != expected).sum())
        result["scalar"][divisor] = int((x / divisor != expected).sum())
    return result


def make_request(tokens: int, heads: int, head_dim: int, pool_factor: int, device: str, seed: int = 0):
    """bf16 pools ``[tokens * pool_factor, heads, head_dim]`` with per-channel key spreads, and permuted slots."""
    generator = torch.Generator(device=device).manual_seed(seed)
    pool_size = tokens * pool_factor
    shape = (pool_size, heads, head_dim)
    spread = torch.rand(heads, head_dim, device=device, generator=generator) * 8 + 0.05
    k_pool = (torch.randn(shape, device=device, generator=generator) * spread).to(torch.bfloat16)
    v_pool = torch.randn(shape, device=device, generator=generator).to(torch.bfloat16)
    slots = torch.randperm(pool_size, device=device, generator=generator)[:tokens]
    return k_pool, v_pool, slots


def edge_request(device: str):
    """Constant key groups (after 4 sink tokens), zeros, tiny/subnormal and large values; no group
    mixes +0.0 and -0.0.
    """
    k_pool, v_pool, slots = make_request(256, 4, 128, 2, device, seed=7)
    k_pool[slots[4:68]] = 0.0
    k_pool[slots[68:132]] = -3.0
    v_pool[slots[:64]] = (v_pool[slots[:64]].float().abs() * 1e-38).to(torch.bfloat16)
    v_pool[slots[64:128], 0] = torch.linspace(-3e4, 3e4, 128, device=device).to(torch.bfloat16)
    return k_pool, v_pool, slots


def compare(label: str, spec, k_pool, v_pool, slots, reference_slots=None) -> list[str]:
    """Kernel vs reference on one request: streams, every prefix decode, upgrade. Returns failures."""
    import lynx_kernels
    from lynx.codec import EncodedKV
    from lynx.codec import pool as reference

    failures = []
    ours = lynx_kernels.encode_from_pool(k_pool, v_pool, slots, spec)
    theirs = reference.encode_from_pool(k_pool, v_pool, slots, spec)
    for index, (a, b) in enumerate(zip(ours.streams, theirs.streams)):
        if not torch.equal(a, b):
            failures.append(f"{label}: stream {index} differs in {int((a != b).sum())} bytes")
    targets = torch.randperm(k_pool.shape[0], device=k_pool.device)[: slots.numel()]
    for stages in range(1, spec.num_stages + 1):
        k_ours, v_ours = torch.zeros_like(k_pool), torch.zeros_like(v_pool)
        k_ref, v_ref = torch.zeros_like(k_pool), torch.zeros_like(v_pool)
        lynx_kernels.decode_into_pool(theirs, k_ours, v_ours, targets, stages)
        reference.decode_into_pool(theirs, k_ref, v_ref, targets, stages)
        if not (_same_bits(k_ours, k_ref) and _same_bits(v_ours, v_ref)):
            failures.append(f"{label}: decode of {stages} stage(s) differs")
    if spec.num_stages > 1:
        shape = (theirs.num_tokens, theirs.kv_heads, theirs.head_dim)
        anchor = EncodedKV.from_streams(theirs.streams[:1], spec, *shape, theirs.dtype)
        k_ours, v_ours = torch.zeros_like(k_pool), torch.zeros_like(v_pool)
        k_ref, v_ref = torch.zeros_like(k_pool), torch.zeros_like(v_pool)
        lynx_kernels.decode_into_pool(anchor, k_ours, v_ours, targets)
        lynx_kernels.upgrade_in_pool(theirs, k_ours, v_ours, targets)
        reference.decode_into_pool(theirs, k_ref, v_ref, targets)
        if not (_same_bits(k_ours, k_ref) and _same_bits(v_ours, v_ref)):
            failures.append(f"{label}: upgrade differs from a full decode")
    if reference_slots is not None:
        cpu = reference.encode_from_pool(k_pool.cpu(), v_pool.cpu(), reference_slots.cpu(), spec)
        gpu = lynx_kernels.encode_from_pool(k_pool, v_pool, reference_slots, spec)
        if not all(torch.equal(a.cpu(), b) for a, b in zip(gpu.streams, cpu.streams)):
            failures.append(f"{label}: streams differ from the CPU reference")
    return failures


def check_exactness(args: argparse.Namespace, specs: dict, device: str) -> list[str]:
    failures = []
    k_pool, v_pool, slots = make_request(args.tokens, args.heads, args.head_dim, args.pool_factor, device)
    edge = edge_request(device)
    sinks_only = make_request(3, args.heads, args.head_dim, args.pool_factor, device, seed=3)
    for step, (name, spec) in enumerate(specs.items(), 1):
        print(f"[{step}/{len(specs)}] exactness {name}", file=sys.stderr, flush=True)
        failures += compare(f"{name} realistic", spec, k_pool, v_pool, slots, slots[: args.cpu_slice])
        failures += compare(f"{name} edge", spec, *edge, reference_slots=edge[2])
        failures += compare(f"{name} 3 tokens", spec, *sinks_only, reference_slots=sinks_only[2])
    return failures


def median_ms(fn: Callable[[], object], repeats: int) -> float:
    """Median wall time of ``fn`` on the GPU, in milliseconds, after two warm-up calls."""
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def measure_bandwidth(args: argparse.Namespace, specs: dict, device: str) -> list[dict]:
    import lynx_kernels
    from lynx_kernels.decode import launch_decode
    from lynx_kernels.encode import launch_encode

    k_pool, v_pool, slots = make_request(args.tokens, args.heads, args.head_dim, args.pool_factor, device)
    nbytes = 2 * slots.numel() * args.heads * args.head_dim * k_pool.element_size()
    gathered = torch.empty((2, slots.numel(), *k_pool.shape[1:]), dtype=k_pool.dtype, device=device)
    copy_target = torch.empty_like(gathered)
    targets = torch.randperm(k_pool.shape[0], device=device)[: slots.numel()]

    def gather():
        torch.index_select(k_pool, 0, slots, out=gathered[0])
        torch.index_select(v_pool, 0, slots, out=gathered[1])

    def scatter():
        k_pool.index_copy_(0, targets, gathered[0])
        v_pool.index_copy_(0, targets, gathered[1])

    copy_ms = median_ms(lambda: copy_target.copy_(gathered), args.repeats)
    gather_ms, scatter_ms = median_ms(gather, args.repeats), median_ms(scatter, args.repeats)
    rows = []
    for step, (name, spec) in enumerate(specs.items(), 1):
        print(f"[{step}/{len(specs)}] bandwidth {name}", file=sys.stderr, flush=True)
        encoded = lynx_kernels.encode_from_pool(k_pool, v_pool, slots, spec)
        timed = [
            ("encode", "kernel", gather_ms, lambda: launch_encode(k_pool, v_pool, slots, spec)),
            ("encode", "api", gather_ms, lambda: lynx_kernels.encode_from_pool(k_pool, v_pool, slots, spec)),
            ("decode anchor", "kernel", scatter_ms, lambda: launch_decode(encoded, k_pool, v_pool, targets, 1)),
            ("decode all", "kernel", scatter_ms, lambda: launch_decode(encoded, k_pool, v_pool, targets, stages)),
            ("decode all", "api", scatter_ms, lambda: lynx_kernels.decode_into_pool(encoded, k_pool, v_pool, targets)),
        ]
        stages = spec.num_stages
        for op, path, baseline_ms, fn in timed:
            ms = median_ms(fn, args.repeats)
            row = {"preset": name, "op": op, "path": path, "ms": ms, "GB/s": nbytes / ms / 1e6}
            row.update({"copy GB/s": nbytes / copy_ms / 1e6, "vs copy": copy_ms / ms})
            row.update({"gather/scatter GB/s": nbytes / baseline_ms / 1e6, "vs gather/scatter": baseline_ms / ms})
            rows.append(row)
    return rows


TILE_ELEMENTS = (2048, 4096, 8192)
WARPS = (2, 4, 8)


def measure_tiles(args: argparse.Namespace, specs: dict, device: str = "cuda") -> list[dict]:
    """Kernel ms of encode, anchor decode and full decode under every tile size and warp
    count; ``same``: the results equal those of the default tiles, bit for bit."""
    from lynx_kernels.decode import launch_decode
    from lynx_kernels.encode import launch_encode
    from lynx_kernels.plan import TilePlan

    k_pool, v_pool, slots = make_request(args.tokens, args.heads, args.head_dim, args.pool_factor, device)
    nbytes = 2 * slots.numel() * args.heads * args.head_dim * k_pool.element_size()
    targets = torch.randperm(k_pool.shape[0], device=device)[: slots.numel()]
    rows = []
    for name, spec in specs.items():
        expected, _ = launch_encode(k_pool, v_pool, slots, spec)
        want_k, want_v = torch.zeros_like(k_pool), torch.zeros_like(v_pool)
        launch_decode(expected, want_k, want_v, targets, spec.num_stages)
        for tile in TILE_ELEMENTS:
            for warps in WARPS:
                plan = TilePlan.for_shape(spec, args.head_dim, tile, warps)
                encoded, _ = launch_encode(k_pool, v_pool, slots, spec, plan)
                k_out, v_out = torch.zeros_like(k_pool), torch.zeros_like(v_pool)
                launch_decode(expected, k_out, v_out, targets, spec.num_stages, plan)
                same_encode = all(torch.equal(a, b) for a, b in zip(encoded.streams, expected.streams))
                same_decode = _same_bits(k_out, want_k) and _same_bits(v_out, want_v)
                timed = [
                    ("encode", same_encode, lambda: launch_encode(k_pool, v_pool, slots, spec, plan)),
                    ("decode anchor", same_decode, lambda: launch_decode(expected, k_out, v_out, targets, 1, plan)),
                    ("decode all", same_decode,
                     lambda: launch_decode(expected, k_out, v_out, targets, spec.num_stages, plan)),
                ]  # fmt: skip
                for op, same, fn in timed:
                    ms = median_ms(fn, args.repeats)
                    rows.append({"preset": name, "op": op, "tile": tile, "warps": warps, "ms": ms,
                                 "GB/s": nbytes / ms / 1e6, "same": same})  # fmt: skip
                    print(f"tiles {name} {tile} x {warps} warps: {op} {ms:.3f} ms, same {same}", file=sys.stderr,
                          flush=True)  # fmt: skip
    return rows


def print_table(rows: list[dict], digits: int = 3) -> None:
    """`rows` as right-aligned columns, floats with `digits` decimals."""
    columns = list(rows[0]) if rows else []
    cells = [[f"{row[c]:.{digits}f}" if isinstance(row[c], float) else str(row[c]) for c in columns] for row in rows]
    widths = [max(len(c), *(len(line[i]) for line in cells)) for i, c in enumerate(columns)]
    print("  ".join(c.rjust(w) for c, w in zip(columns, widths)))
    for line in cells:
        print("  ".join(cell.rjust(w) for cell, w in zip(line, widths)))


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


if __name__ == "__main__":
    sys.exit(main())
