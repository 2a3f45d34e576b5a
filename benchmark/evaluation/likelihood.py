"""Teacher-forced log-likelihood and KL divergence of held-out text under each wire format's context KV.

What is measured is what a decode server computes: the context's KV comes
out of the wire format (Lynx's own `WireFormat.encode` / `write`, the
functions the servers run, bf16 pool in and out), and the continuation is
scored on top of it with its own KV at full precision. The first
continuation token is left out: on a PD pair the prefill computes it on
exact KV.

Why not on the served pair: the prefill server computes prompt logprobs on
its own full-precision KV, and the decode server computes no prompt logits;
forcing a continuation through the decode server (a grammar or logit bias)
masks the logits before SGLang reports logprobs; and `--lynx-loopback`
turns the radix cache off, so a continuation cannot be scored over a
round-tripped context. So one process does it: transformers (fp32, like the
servers' `--dtype float32`) computes the context KV and the continuation's
logits; the KV in between is exactly what crosses the link.

Variants: ``int8`` (what `lynx` decodes after verification), ``int4`` (the
`lynx` anchor alone), ``2+6`` (`lynx-2+6` after verification) and ``2-bit``
(its anchor alone, which no `--lynx-mode` serves), each against ``bf16``.
"""

from __future__ import annotations

import contextlib
import math
import random
import statistics
from collections.abc import Callable, Sequence

import torch

from lynx.kvwire import KVShape, WireFormat

# name -> (mode, preset, streams written: None = all)
CODECS = {
    "int8": ("int8", "int8", None),
    "int4": ("int4", "int4", None),
    "2+6": ("lynx", "2+6", None),
    "2-bit": ("lynx", "2+6", 1),
}


def roundtrip(kv: Sequence[tuple[torch.Tensor, torch.Tensor]], codec: str) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Each layer's (K, V) ``[tokens, kv_heads, head_dim]`` bf16 after the wire format `codec`."""
    mode, preset, keep = CODECS[codec]
    wire = WireFormat.for_mode(mode, preset)
    k_pools = [k.clone() for k, _ in kv]
    v_pools = [v.clone() for _, v in kv]
    tokens, heads, dim = k_pools[0].shape
    slots = torch.arange(tokens, dtype=torch.int64)
    streams = wire.encode(k_pools, v_pools, slots)
    shape = KVShape(len(kv), tokens, heads, dim, k_pools[0].dtype)
    wire.write(streams if keep is None else streams[:keep], shape, k_pools, v_pools, slots)
    return list(zip(k_pools, v_pools))


class TeacherForcing:
    """A transformers causal LM in fp32 that scores a continuation over a given context KV."""

    def __init__(self, model_path) -> None:
        from transformers import AutoModelForCausalLM
        from transformers.utils import logging

        logging.disable_progress_bar()
        self.model = AutoModelForCausalLM.from_pretrained(str(model_path), dtype=torch.float32).eval()

    @torch.no_grad()
    def context_kv(self, context_ids: Sequence[int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per layer (K, V) of the context, ``[tokens, kv_heads, head_dim]``, rounded to bf16 like the pool."""
        out = self.model(torch.tensor([list(context_ids)]), use_cache=True)
        layers = out.past_key_values.layers
        return [(layer.keys[0].transpose(0, 1).to(torch.bfloat16), layer.values[0].transpose(0, 1).to(torch.bfloat16))
                for layer in layers]  # fmt: skip

    @torch.no_grad()
    def continuation_logprobs(self, kv, continuation_ids: Sequence[int]) -> torch.Tensor:
        """``[len - 1, vocab]`` log-probabilities predicting continuation tokens 1.. over context KV `kv`."""
        from transformers import DynamicCache

        cache = DynamicCache()
        for index, (k, v) in enumerate(kv):
            cache.update(k.transpose(0, 1)[None].float(), v.transpose(0, 1)[None].float(), index)
        inputs = torch.tensor([list(continuation_ids[:-1])])
        logits = self.model(inputs, past_key_values=cache, use_cache=True).logits[0].float()
        return torch.log_softmax(logits, dim=-1)


def compare_window(reference: torch.Tensor, candidate: torch.Tensor, targets: Sequence[int]) -> dict:
    """Mean per position over one window: KL(ref || cand), the targets' NLL difference, top-1 agreement."""
    target = torch.tensor(list(targets))
    kl = (reference.exp() * (reference - candidate)).sum(-1)
    positions = torch.arange(len(target))
    nll_ref = -reference[positions, target]
    nll_cand = -candidate[positions, target]
    return {
        "kl": float(kl.mean()),
        "kl_max": float(kl.max()),
        "delta_nll": float((nll_cand - nll_ref).mean()),
        "nll_ref": float(nll_ref.mean()),
        "top1_agree": float((reference.argmax(-1) == candidate.argmax(-1)).float().mean()),
        "positions": len(target),
    }


def score_windows(scorer: TeacherForcing, windows, codecs: Sequence[str], step: Callable[[], None],
                  gate=None) -> dict[str, list[dict]]:  # fmt: skip
    """Per codec, one `compare_window` record per held-out window (`gate`: a lock held around each window)."""
    out: dict[str, list[dict]] = {c: [] for c in codecs}
    for window in windows:
        with gate if gate is not None else contextlib.nullcontext():
            kv = scorer.context_kv(window.context_ids)
            targets = window.continuation_ids[1:]
            reference = scorer.continuation_logprobs(kv, window.continuation_ids)
            for codec in codecs:
                candidate = scorer.continuation_logprobs(roundtrip(kv, codec), window.continuation_ids)
                out[codec].append({"source": window.source, "offset": window.offset,
                                   **compare_window(reference, candidate, targets)})  # fmt: skip
        step()
    return out


def interval(values: Sequence[float], level: float = 0.95, resamples: int = 2000, seed: int = 0) -> dict:
    """Mean of per-window values with a percentile-bootstrap confidence interval over windows."""
    if not values:
        return {"mean": None, "low": None, "high": None, "n": 0}
    rng = random.Random(seed)
    means = sorted(statistics.fmean(rng.choices(values, k=len(values))) for _ in range(resamples))
    tail = (1 - level) / 2
    low = means[max(0, math.floor(tail * resamples))]
    high = means[min(resamples - 1, math.ceil((1 - tail) * resamples) - 1)]
    return {"mean": statistics.fmean(values), "low": low, "high": high, "n": len(values)}


def summarize(per_codec: dict[str, list[dict]]) -> dict[str, dict]:
    """Per codec: mean KL, NLL difference and top-1 agreement over windows, each with a 95% interval."""
    return {
        codec: {key: interval([r[key] for r in records]) for key in ("kl", "delta_nll", "top1_agree")}
        | {"nll_ref": statistics.fmean(r["nll_ref"] for r in records) if records else None}
        for codec, records in per_codec.items()
    }

