"""Codec quality on real KV: SmolLM2-135M-Instruct over Paul Graham essay excerpts.

For each prompt (``--prompt-tokens`` tokens, excerpts starting at essays spread
over the collection), the model prefills the first ``N - C`` tokens
(``C = --continuation``). Its KV cache, cast to bfloat16, is the reference
"BF16 KV" and the codec input. For every preset, and the three-stage spec
``CodecSpec(stage_bits=(2, 2, 4))``, and every number of streams received
(anchor only ... all), and with ``--candidates`` for every anchor and
residual design of ``anchor_candidates.py``, this reports:

* bytes per token of each stream and of the streams used, K+V over all layers,
  exactly for the ``N - C`` prefix tokens (raw sink tokens included), from
  ``spec.stream_bytes`` and checked against the encoded stream sizes;
* relative attention-output error ``||o_hat - o|| / ||o||`` per layer and
  query head (GQA: query head ``h`` reads KV head ``h // group``), averaged
  over heads and prompts; mean and max over layers. The queries are the
  model's own post-RoPE queries of the last ``--queries`` prefill positions,
  recomputed in a forward pre-hook on each attention module from its input,
  ``q_proj`` and transformers' ``apply_rotary_pos_emb``; the script checks
  they reproduce the model's attention output before ``o_proj``;
* top-1 agreement over the ``C`` teacher-forced continuation tokens, fed in
  one forward pass on a cache holding the decoded KV, against the same pass on
  the BF16 KV: the fraction of positions whose argmax agrees, and at each
  position where it does not, how near a tie the BF16 pass was there (its
  top-1 minus top-2 log-probability, nats): ``parted`` counts those
  positions, ``parted_near_tie`` those under ``NEAR_TIE_NATS``.

The model runs in float32 (its weights are bf16 values; bf16 matmuls are much
slower on CPUs without bf16 units); only the cache is rounded to bf16. The
``bf16-exact`` preset with every stream must rebuild the BF16 KV bit for bit
and agree everywhere; the script exits with status 1 if it does not.
Progress goes to stderr, a table to stdout, everything to ``--json`` (per-layer
errors to 4 significant digits).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from anchor_candidates import candidates
from lynx.codec import CodecSpec, decode, encode

DEFAULT_JSON = Path(__file__).resolve().parents[1] / "results" / "codec_quality.json"
QUERY_CHECK_TOLERANCE = 1e-4
NEAR_TIE_NATS = 0.1


def specs() -> list[tuple[str, CodecSpec]]:
    """Every preset, then the three-stage split 2+2+4."""
    named = [(name, CodecSpec.preset(name)) for name in CodecSpec.preset_names()]
    return [*named, ("2+2+4", CodecSpec(stage_bits=(2, 2, 4)))]


def load_model(threads: int | None):
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from lynx_deploy.models import prepare_smollm2

    if threads is not None:
        torch.set_num_threads(threads)
    folder = prepare_smollm2(log=lambda message: print(message, file=sys.stderr))
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    return model, tokenizer


def prompt_ids(tokenizer, num_prompts: int, num_tokens: int) -> list[tuple[int, torch.Tensor]]:
    """(first essay index, ``[1, num_tokens]`` ids) of each prompt, starts spread over the essays."""
    from lynx_testing.prompts import essay_excerpt, essays

    count = len(essays())
    prompts = []
    for number in range(num_prompts):
        index = number * count // num_prompts
        ids = tokenizer.encode(essay_excerpt(tokenizer, num_tokens + 64, index), add_special_tokens=False)
        if len(ids) < num_tokens:
            raise SystemExit(f"error: essay excerpt {index} has only {len(ids)} tokens, need {num_tokens}")
        prompts.append((index, torch.tensor([ids[:num_tokens]])))
    return prompts


def prefill(model, ids: torch.Tensor, num_queries: int):
    """Run the prefix; return the BF16 KV ``[(k, v)]`` (each ``[T, Hkv, D]``), the post-RoPE
    queries ``[Hq, Q, D]`` of the last ``num_queries`` positions and the attention outputs
    ``[Hq, Q, D]`` the model computed for them, one entry per layer.
    """
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    layers = model.model.layers
    head_dim = model.config.head_dim
    queries, outputs, handles = {}, {}, []

    def capture_query(index):
        def hook(module, args, kwargs):
            hidden = (kwargs["hidden_states"] if "hidden_states" in kwargs else args[0])[:, -num_queries:]
            cos, sin = kwargs["position_embeddings"]
            query = module.q_proj(hidden).view(1, num_queries, -1, head_dim).transpose(1, 2)
            queries[index] = apply_rotary_pos_emb(query, query, cos[:, -num_queries:], sin[:, -num_queries:])[0][0]
        return hook

    def capture_output(index):
        def hook(module, args):
            outputs[index] = args[0][0, -num_queries:].view(num_queries, -1, head_dim).transpose(0, 1)
        return hook

    for index, layer in enumerate(layers):
        handles.append(layer.self_attn.register_forward_pre_hook(capture_query(index), with_kwargs=True))
        handles.append(layer.self_attn.o_proj.register_forward_pre_hook(capture_output(index)))
    try:
        with torch.no_grad():
            cache = model(ids, use_cache=True, logits_to_keep=1).past_key_values
    finally:
        for handle in handles:
            handle.remove()
    kv = [(layer.keys[0].transpose(0, 1), layer.values[0].transpose(0, 1)) for layer in cache.layers]
    return kv, [queries[i] for i in range(len(layers))], [outputs[i] for i in range(len(layers))]


def attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scaling: float) -> torch.Tensor:
    """Causal attention of the last ``Q`` positions: query ``[Hq, Q, D]``, key/value ``[T, Hkv, D]``
    (any float dtype) -> ``[Hq, Q, D]`` float32.
    """
    heads, count, _ = query.shape
    tokens, kv_heads, _ = key.shape
    group = heads // kv_heads
    k = key.float().transpose(0, 1).repeat_interleave(group, dim=0)
    v = value.float().transpose(0, 1).repeat_interleave(group, dim=0)
    positions = torch.arange(tokens - count, tokens)
    mask = torch.arange(tokens)[None, :] <= positions[:, None]
    return F.scaled_dot_product_attention(query.float(), k, v, attn_mask=mask, scale=scaling)


def relative_error(estimate: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
    """``||estimate - reference|| / ||reference||`` per head of ``[H, Q, D]`` tensors -> ``[H]``."""
    return (estimate - reference).norm(dim=(1, 2)) / reference.norm(dim=(1, 2))


def continuation_logprobs(model, kv: list, continuation: torch.Tensor) -> torch.Tensor:
    """Log-probabilities ``[C, vocab]`` of one forward over ``continuation`` ``[1, C]`` on a cache holding ``kv``."""
    from transformers import DynamicCache

    data = [(k.float().transpose(0, 1)[None].contiguous(), v.float().transpose(0, 1)[None].contiguous())
            for k, v in kv]
    cache = DynamicCache(ddp_cache_data=data, config=model.config)
    with torch.no_grad():
        logits = model(continuation, past_key_values=cache, use_cache=True).logits[0]
    return logits.float().log_softmax(dim=-1)


def variant_rows(num_layers: int, kv_heads: int, head_dim: int, tokens: int, designs: list) -> list[dict]:
    """One result record per (spec, streams used), then per design; accumulators empty.

    Bytes per token are exact for ``tokens`` tokens: each stream's bytes over all layers, over ``tokens``.
    """
    rows = []
    for name, spec in specs():
        streams = [b * num_layers / tokens for b in spec.stream_bytes(tokens, kv_heads, head_dim, torch.bfloat16)]
        for stages in range(1, spec.num_stages + 1):
            rows.append(_row(name, spec, stages, streams) | {"measured_stream_bytes_per_token": None})
    for design in designs:
        streams = [b * num_layers / tokens for b in design.spec.stream_bytes(tokens, kv_heads, head_dim)]
        stages = 1 if design.study == "anchor" else design.spec.num_stages
        streams[0] += design.extra_bytes(tokens, kv_heads, head_dim) * num_layers / tokens
        rows.append(_row(design.name, design.spec, stages, streams[:stages])
                    | {"study": design.study, "simulated": design.simulated, "role": design.role})
    return rows


def _row(name: str, spec: CodecSpec, stages: int, streams: list[float]) -> dict:
    return {"spec": name, "stage_bits": list(spec.stage_bits), "raw_residual": spec.raw_residual,
            "sink_tokens": spec.sink_tokens, "key_group_tokens": spec.key_group_tokens,
            "value_group_channels": spec.value_group_channels, "scale_dtype": spec.scale_dtype,
            "stages": stages, "num_stages": spec.num_stages, "stream_bytes_per_token": streams,
            "bytes_per_token": sum(streams[:stages]), "layer_errors": [], "equal": [], "parted_gaps": []}


def encode_layers(kv: list, spec: CodecSpec, expected: list[float], name: str) -> tuple[list, list[float]]:
    """Encode every layer's ``(k, v)``; return the encodings and the measured bytes per token of
    each stream over all layers, which must equal ``expected``.
    """
    tokens = kv[0][0].shape[0]
    encoded = [encode(k, v, spec) for k, v in kv]
    measured = [sum(enc.streams[s].numel() for enc in encoded) / tokens for s in range(spec.num_stages)]
    if measured != expected:
        raise SystemExit(f"error: {name} streams hold {measured} B/token, stream_bytes says {expected}")
    return encoded, measured


def evaluate_prompt(model, ids: torch.Tensor, args: argparse.Namespace, rows: list[dict], label: str,
                    designs: dict, near_ties: list[int]) -> float:
    """Add one prompt's errors and agreements to ``rows`` and its count of near-tie positions
    (BF16 KV) to ``near_ties``; return the query check's max error.
    """
    prefix, continuation = ids[:, : -args.continuation], ids[:, -args.continuation :]
    kv32, queries, outputs = prefill(model, prefix, args.queries)
    scaling = model.model.layers[0].self_attn.scaling
    check = max(float(relative_error(attention(q, k, v, scaling), o).max())
                for q, (k, v), o in zip(queries, kv32, outputs))
    if check > QUERY_CHECK_TOLERANCE:
        raise SystemExit(f"error: recomputed queries miss the model's attention output (rel err {check:.2e})")
    kv = [(k.to(torch.bfloat16), v.to(torch.bfloat16)) for k, v in kv32]
    reference_out = [attention(q, k, v, scaling) for q, (k, v) in zip(queries, kv)]
    best = continuation_logprobs(model, kv, continuation).topk(2, dim=-1)
    reference_top, reference_gap = best.indices[:, 0], best.values[:, 0] - best.values[:, 1]
    near_ties.append(int((reference_gap < NEAR_TIE_NATS).sum()))
    encoded, spec_by_name = {}, dict(specs())
    for row in rows:
        if row["spec"] in designs:
            decoded = [designs[row["spec"]].decode(k, v) for k, v in kv]
        else:
            if row["spec"] not in encoded:
                spec = spec_by_name[row["spec"]]
                expected = row["stream_bytes_per_token"]
                encoded[row["spec"]], measured = encode_layers(kv, spec, expected, row["spec"])
                for other in rows:
                    if other["spec"] == row["spec"]:
                        other["measured_stream_bytes_per_token"] = measured
            decoded = [decode(enc, row["stages"]) for enc in encoded[row["spec"]]]
        exact = row["spec"] == "bf16-exact" and row["stages"] == row["num_stages"]
        if exact and not all(torch.equal(a, b) for pair, ref in zip(decoded, kv) for a, b in zip(pair, ref)):
            raise SystemExit("error: bf16-exact with every stream did not rebuild the BF16 KV bit for bit")
        row["layer_errors"].append([float(relative_error(attention(q, k, v, scaling), o).mean())
                                    for q, (k, v), o in zip(queries, decoded, reference_out)])
        equal = continuation_logprobs(model, decoded, continuation).argmax(dim=-1) == reference_top
        row["equal"].append(equal.tolist())
        row["parted_gaps"] += reference_gap[~equal].tolist()
        agreement = sum(row["equal"][-1]) / args.continuation
        print(f"[{label}] {row['spec']} {row['stages']}/{row['num_stages']}: agreement {agreement:.4f}",
              file=sys.stderr, flush=True)
        if exact and agreement != 1.0:
            raise SystemExit(f"error: bf16-exact with every stream agreed on {agreement:.4f} of positions, not 1.0")
    return check


def summarize(rows: list[dict], bf16_bytes: float) -> None:
    for row in rows:
        per_layer = [sum(column) / len(column) for column in zip(*row["layer_errors"])]
        equal = [flag for prompt in row["equal"] for flag in prompt]
        row.update({"of_bf16": row["bytes_per_token"] / bf16_bytes,
                    "attn_err_per_layer": [float(f"{error:.4g}") for error in per_layer],
                    "attn_err_mean": sum(per_layer) / len(per_layer), "attn_err_max": max(per_layer),
                    "agreement": sum(equal) / len(equal), "parted": len(row["parted_gaps"]),
                    "parted_near_tie": sum(gap < NEAR_TIE_NATS for gap in row["parted_gaps"]),
                    "parted_gaps": sorted(row["parted_gaps"]),
                    "agreement_per_prompt": [sum(prompt) / len(prompt) for prompt in row["equal"]]})
        del row["layer_errors"], row["equal"]


def print_table(rows: list[dict], config: dict) -> None:
    print(f"\nSmolLM2-135M-Instruct, {config['num_prompts']} essay prompts x {config['prompt_tokens']} tokens "
          f"(prefix {config['prefix_tokens']}, {config['continuation']} teacher-forced), attention error over the "
          f"last {config['queries']} prefix queries; bytes/token are K+V over {config['num_layers']} layers "
          f"(BF16: {config['bf16_bytes_per_token']:g}); {config['threads']} thread(s); "
          f"{config['near_tie_positions']} of {config['num_prompts'] * config['continuation']} positions are "
          f"near ties on BF16 KV (top-2 within {NEAR_TIE_NATS} nats)")
    print(f"{'spec':<34} {'streams':>7} {'stream B/token':<26} {'used B/token':>12} {'of BF16':>8} "
          f"{'attn err mean':>13} {'attn err max':>12} {'top-1 agree':>11} {'parted (near tie)':>17}")
    for row in rows:
        streams = "+".join(f"{b:.1f}" for b in row["stream_bytes_per_token"])
        print(f"{row['spec']:<34} {row['stages']:>3}/{row['num_stages']:<3} {streams:<26} "
              f"{row['bytes_per_token']:>12.1f} {row['of_bf16']:>8.4f} {row['attn_err_mean']:>13.3e} "
              f"{row['attn_err_max']:>12.3e} {row['agreement']:>11.4f} {row['parted']:>9} ({row['parted_near_tie']})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num-prompts", type=int, default=4, help="essay excerpts (default 4)")
    parser.add_argument("--prompt-tokens", type=int, default=2048, help="tokens per prompt, N (default 2048)")
    parser.add_argument("--continuation", type=int, default=128,
                        help="teacher-forced tokens after the encoded prefix, C (default 128)")
    parser.add_argument("--queries", type=int, default=64,
                        help="last prefix positions whose queries measure attention error (default 64)")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch intra-op threads (default: torch's, which follows OMP_NUM_THREADS)")
    parser.add_argument("--candidates", action="store_true",
                        help="also measure the anchor and residual designs of benchmark/anchor_candidates.py")
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON,
                        help="write config and every result here (default results/codec_quality.json)")
    args = parser.parse_args(argv)
    if min(args.num_prompts, args.continuation, args.queries) < 1 or (args.threads is not None and args.threads < 1):
        parser.error("--num-prompts, --continuation, --queries and --threads must be positive")
    if args.prompt_tokens - args.continuation < args.queries:
        parser.error("--prompt-tokens minus --continuation must be at least --queries")

    model, tokenizer = load_model(args.threads)
    cfg = model.config
    prompts = prompt_ids(tokenizer, args.num_prompts, args.prompt_tokens)
    designs = {design.name: design for design in candidates()} if args.candidates else {}
    prefix_tokens = args.prompt_tokens - args.continuation
    rows = variant_rows(cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim, prefix_tokens,
                        list(designs.values()))
    near_ties: list[int] = []
    checks = [evaluate_prompt(model, ids, args, rows, f"prompt {number + 1}/{len(prompts)}", designs, near_ties)
              for number, (_, ids) in enumerate(prompts)]
    bf16_bytes = 2 * cfg.num_key_value_heads * cfg.head_dim * 2 * cfg.num_hidden_layers
    summarize(rows, bf16_bytes)
    config = {
        "date": datetime.date.today().isoformat(), "model": "SmolLM2-135M-Instruct", "model_dtype": "float32",
        "kv_dtype": "bfloat16", "num_layers": cfg.num_hidden_layers, "kv_heads": cfg.num_key_value_heads,
        "query_heads": cfg.num_attention_heads, "head_dim": cfg.head_dim, "num_prompts": args.num_prompts,
        "prompt_essay_indices": [index for index, _ in prompts], "prompt_tokens": args.prompt_tokens,
        "prefix_tokens": prefix_tokens, "continuation": args.continuation, "candidates": args.candidates,
        "queries": args.queries, "near_tie_nats": NEAR_TIE_NATS, "near_tie_positions": sum(near_ties),
        "bf16_bytes_per_token": bf16_bytes, "query_check_max_rel_err": max(checks),
        "threads": torch.get_num_threads(), "torch": torch.__version__, "python": platform.python_version(),
    }
    print_table(rows, config)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"config": config, "results": rows}, indent=2))
    print(f"wrote {args.json}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
