"""Bytes on the wire per token of every codec preset, for the KV shapes of two models.

For each model shape (``NAME=LAYERSxHEADSxDIM``) and each spec (every preset,
then the three-stage split 2+2+4), from the codec's own byte accounting
(``CodecSpec.bytes_per_token`` and ``CodecSpec.stream_bytes``), BF16 input,
K and V together over all layers:

* each stream's bytes per further quantized token;
* the fixed cost of the sink tokens per request, per stream:
  ``stream_bytes(T) - T * bytes_per_token`` for ``T`` a whole number of key
  groups after the sink tokens (raw sink bytes in the anchor less what
  quantized tokens would cost; the residual streams carry fewer tokens);
* each stream's bytes per token of whole requests of ``--tokens`` tokens,
  ``stream_bytes(T) / T``.

Before it writes anything, the script encodes one random layer of every shape
and spec and checks that the encoded streams are as long as ``stream_bytes``
says. A table goes to stdout, everything to ``--json``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from lynx.codec import CodecSpec, encode

DEFAULT_SHAPES = "SmolLM2-135M-Instruct=30x3x64,Llama-3.1-8B=32x8x128"
DEFAULT_TOKENS = "1920,32768"


def specs() -> list[tuple[str, CodecSpec]]:
    """Every preset, then the three-stage split 2+2+4 (the specs of ``codec_quality.py``)."""
    named = [(name, CodecSpec.preset(name)) for name in CodecSpec.preset_names()]
    return [*named, ("2+2+4", CodecSpec(stage_bits=(2, 2, 4)))]


def parse_shape(text: str) -> tuple[str, int, int, int]:
    """``"Name=32x8x128"`` -> ``("Name", 32, 8, 128)`` (model, layers, kv_heads, head_dim)."""
    name, _, dims = text.partition("=")
    parts = dims.lower().split("x")
    if not name.strip() or len(parts) != 3 or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise argparse.ArgumentTypeError(f"shape must be NAME=LAYERSxHEADSxDIM of positive ints, got {text!r}")
    layers, heads, dim = (int(p) for p in parts)
    return name.strip(), layers, heads, dim


def spec_record(name: str, spec: CodecSpec, layers: int, heads: int, dim: int, tokens: list[int]) -> dict:
    """One spec's bytes for one model shape (all layers, K+V, BF16)."""
    per_token = [b * layers for b in spec.bytes_per_token(heads, dim)]
    whole = spec.sink_tokens + spec.key_group_tokens
    fixed = [b * layers - whole * p for b, p in zip(spec.stream_bytes(whole, heads, dim), per_token)]
    at_tokens = [{"tokens": count,
                  "stream_bytes_per_token": [b * layers / count for b in spec.stream_bytes(count, heads, dim)]}
                 for count in tokens]  # fmt: skip
    return {"spec": name, "stage_bits": list(spec.stage_bits), "raw_residual": spec.raw_residual,
            "sink_tokens": spec.sink_tokens, "stream_bytes_per_token": per_token,
            "sink_bytes_per_request": fixed, "at_tokens": at_tokens}  # fmt: skip


def check_encoded_sizes(spec: CodecSpec, heads: int, dim: int, name: str) -> None:
    """Encode one random BF16 layer of two key groups and a partial one; exit 1 unless every
    stream is as long as ``stream_bytes`` says."""
    tokens = spec.sink_tokens + 2 * spec.key_group_tokens + 3
    generator = torch.Generator().manual_seed(0)
    key, value = (torch.randn(tokens, heads, dim, generator=generator).bfloat16() for _ in range(2))
    measured = tuple(stream.numel() for stream in encode(key, value, spec).streams)
    expected = spec.stream_bytes(tokens, heads, dim)
    if measured != expected:
        raise SystemExit(f"error: {name} encoded {measured} bytes, stream_bytes says {expected}")


def print_table(shape: dict) -> None:
    print(f"\n{shape['model']}: {shape['layers']} layers x {shape['kv_heads']} kv heads x {shape['head_dim']}, "
          f"BF16 {shape['bf16_bytes_per_token']} B/token")
    print(f"{'spec':<11} {'B per further token (streams)':<32} {'sink tokens per request':<30}")
    for row in shape["specs"]:
        streams = " + ".join(f"{b:g}" for b in row["stream_bytes_per_token"])
        fixed = " / ".join(f"{b:+g}" for b in row["sink_bytes_per_request"])
        print(f"{row['spec']:<11} {streams:<32} {fixed:<30}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", default=DEFAULT_SHAPES,
                        help=f"comma-separated NAME=LAYERSxHEADSxDIM (default {DEFAULT_SHAPES})")
    parser.add_argument("--tokens", default=DEFAULT_TOKENS,
                        help=f"comma-separated request lengths for bytes per token of a whole request "
                             f"(default {DEFAULT_TOKENS})")  # fmt: skip
    parser.add_argument("--json", type=Path, required=True, help="write every figure here")
    args = parser.parse_args(argv)
    try:
        shapes = [parse_shape(text) for text in args.shapes.split(",") if text.strip()]
    except argparse.ArgumentTypeError as exc:
        parser.error(str(exc))
    tokens = [int(t) for t in args.tokens.split(",") if t.strip().isdigit() and int(t) > 0]
    if not shapes or len(tokens) != len([t for t in args.tokens.split(",") if t.strip()]):
        parser.error("need at least one shape, and --tokens must be positive ints")
    records = []
    for model, layers, heads, dim in shapes:
        for name, spec in specs():
            check_encoded_sizes(spec, heads, dim, name)
        records.append({"model": model, "layers": layers, "kv_heads": heads, "head_dim": dim,
                        "bf16_bytes_per_token": 2 * heads * dim * 2 * layers,
                        "specs": [spec_record(name, spec, layers, heads, dim, tokens) for name, spec in specs()]})
        print_table(records[-1])
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"config": {"input_dtype": "bfloat16", "tokens": tokens}, "shapes": records},
                                    indent=1) + "\n")
    print(f"wrote {args.json}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
