"""`python -m lynx_deploy.estimate`: the estimate per mode for a model, prompt length and link rates, as a table or JSON."""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import asdict

from lynx_deploy.estimate.model import (
    COMPUTE_SHAPES,
    DTYPES,
    GEOMETRIES,
    MODES,
    KVGeometry,
    ModeEstimate,
    Scenario,
    chunk_units,
    estimate,
    prefill_tok_s_from_flops,
)


def _csv(kind):
    def parse(text: str):
        try:
            values = [kind(part) for part in text.split(",") if part.strip()]
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        if not values:
            raise argparse.ArgumentTypeError("expected a comma-separated list")
        return values

    return parse


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m lynx_deploy.estimate",
        description="Estimate TTFT per --lynx-mode at cluster scale (an estimate, not a measurement).",
    )
    add = parser.add_argument
    add("--model", choices=sorted(GEOMETRIES), default="llama-3.1-8b", help="KV geometry preset.")
    add("--layers", type=int, help="Override the preset's layer count.")
    add("--kv-heads", type=int, help="Override the preset's KV heads.")
    add("--head-dim", type=int, help="Override the preset's head dim.")
    add("--dtype", choices=DTYPES, help="Override the KV dtype (default bfloat16).")
    add("--tokens", type=_csv(int), default=[8192, 32768, 131072], help="Prompt lengths.")
    add("--gbps", type=_csv(float), default=[10.0, 25.0, 100.0, 400.0], help="Link rates, Gbit/s.")
    prefill = parser.add_mutually_exclusive_group(required=True)
    prefill.add_argument("--prefill-tok-s", type=float, help="Prefill throughput, tokens/s.")
    prefill.add_argument(
        "--prefill-tflops", type=float,
        help="Effective prefill compute, TFLOP/s: throughput from the model's size at each length.",
    )  # fmt: skip
    add("--encode-gbps", type=float, default=math.inf, help="Codec encode, GB/s of KV (default: free).")
    add("--decode-gbps", type=float, default=math.inf, help="Codec decode, GB/s of KV (default: free).")
    add("--decode-step-ms", type=float, default=0.0, help="One decode step, ms (default 0).")
    add("--pipeline-units", type=int, help="Units of the overlapped pipeline (default: layers).")
    add("--chunk-tokens", type=int, help="Chunked prefill: one pipeline unit per chunk of this many tokens.")
    add("--preset", default="int8", help="Codec preset of lynx mode (default int8).")
    add("--json", action="store_true", help="Print JSON instead of the table.")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    base = GEOMETRIES[args.model]
    changed = any((args.layers, args.kv_heads, args.head_dim, args.dtype))
    try:
        geometry = KVGeometry(
            f"{base.name} (modified)" if changed else base.name,
            args.layers or base.num_layers,
            args.kv_heads or base.kv_heads,
            args.head_dim or base.head_dim,
            args.dtype or base.dtype,
        )
        if args.prefill_tflops is not None and base.name not in COMPUTE_SHAPES:
            raise ValueError(f"--prefill-tflops needs the size of {base.name}; pass --prefill-tok-s")
        rows = []
        for tokens in args.tokens:
            rate = args.prefill_tok_s
            if rate is None:
                params, d_model = COMPUTE_SHAPES[base.name]
                rate = prefill_tok_s_from_flops(params, d_model, geometry.num_layers, tokens, args.prefill_tflops)
            units = args.pipeline_units
            if units is None and args.chunk_tokens is not None:
                units = chunk_units(tokens, args.chunk_tokens)
            for gbps in args.gbps:
                scenario = Scenario(
                    tokens, gbps, rate, args.encode_gbps, args.decode_gbps, args.decode_step_ms / 1e3, units
                )  # fmt: skip
                rows += [estimate(geometry, scenario, mode, args.preset) for mode in MODES]
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(_as_json(args, geometry, rows), indent=1) if args.json else _table(args, geometry, rows))
    return 0


def _header(args, geometry: KVGeometry) -> str:
    if math.isinf(args.encode_gbps) and math.isinf(args.decode_gbps):
        codec = "codec time not counted"
    else:
        codec = f"codec encode {args.encode_gbps:g} GB/s, decode {args.decode_gbps:g} GB/s"
    return (
        f"ESTIMATE (model, not a measurement): {geometry.name}, {geometry.num_layers} layers, "
        f"{geometry.kv_heads} KV heads x {geometry.head_dim}, {geometry.dtype}; "
        f"prefill {_prefill_text(args)}; {codec}; decode step {args.decode_step_ms:g} ms; "
        f"lynx preset {args.preset}"
    )


def _prefill_text(args) -> str:
    if args.prefill_tok_s is not None:
        return f"{args.prefill_tok_s:g} tok/s"
    return f"compute-bound at {args.prefill_tflops:g} TFLOP/s effective"


def _units_text(args) -> str:
    if args.pipeline_units is not None:
        return f"in {args.pipeline_units} units"
    if args.chunk_tokens is not None:
        return f"per {args.chunk_tokens}-token prefill chunk"
    return "per layer"


_COLUMNS = (
    ("tokens", 7), ("Gbps", 6), ("mode", -5), ("B/token/stream", -15), ("critical MiB", 12),
    ("xfer/prefill", 12), ("est TTFT seq s", 14), ("est TTFT ovl s", 14), ("all streams ovl s", 17),
)  # fmt: skip


def _table(args, geometry: KVGeometry, rows: list[ModeEstimate]) -> str:
    def line(cells) -> str:
        return " ".join(f"{c:<{-w}}" if w < 0 else f"{c:>{w}}" for c, (_, w) in zip(cells, _COLUMNS))

    lines = [_header(args, geometry), "", line(name for name, _ in _COLUMNS)]
    for r in rows:
        lines.append(line((
            r.tokens, f"{r.link_gbps:g}", r.mode, "+".join(f"{b:g}" for b in r.stream_bytes_per_token),
            f"{r.critical_bytes / 2**20:.1f}", f"{r.transfer_to_prefill:.3f}",
            f"{r.ttft_sequential_s:.4f}", f"{r.ttft_overlapped_s:.4f}", f"{r.all_streams_overlapped_s:.4f}",
        )))  # fmt: skip
    lines += ["", f"seq: transfer after prefill; ovl: pipelined with prefill {_units_text(args)}. All figures are estimates."]
    return "\n".join(lines)


def _as_json(args, geometry: KVGeometry, rows: list[ModeEstimate]) -> dict:
    return {
        "kind": "estimate",
        "note": "modelled from KV geometry, link rate and measured rates; not a measurement",
        "geometry": asdict(geometry),
        "prefill_tok_s": args.prefill_tok_s,
        "prefill_tflops": args.prefill_tflops,
        "chunk_tokens": args.chunk_tokens,
        "encode_gbps": None if math.isinf(args.encode_gbps) else args.encode_gbps,
        "decode_gbps": None if math.isinf(args.decode_gbps) else args.decode_gbps,
        "decode_step_s": args.decode_step_ms / 1e3,
        "pipeline_units": args.pipeline_units or (None if args.chunk_tokens else geometry.num_layers),
        "lynx_preset": args.preset,
        "rows": [
            {"kind": "estimate", **asdict(r), "transfer_to_prefill": r.transfer_to_prefill} for r in rows
        ],
    }

