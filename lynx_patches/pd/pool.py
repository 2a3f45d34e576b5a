"""Which SGLang KV pools the lynx backend serves, and which heads a rank's pool holds."""

from __future__ import annotations

from lynx.heads import HeadShard
from lynx.pd.pool import SUPPORTED_DTYPES


# KV layouts the lynx backend refuses, by SGLang pool class: what each holds
# and what serving it would need (docs/SERVING.md, "Known limits").
UNSUPPORTED_LAYOUTS = {
    "MLATokenToKVPool": (
        "MLA (one compressed latent and a rope key per token, no per-head K/V)",
        "a codec for the latent vector (its anchor/residual split per channel group, the rope key apart) "
        "and a verify pass that upgrades the latent before attention",
    ),
    "SWAKVPool": (
        "a hybrid sliding-window pool (full-attention and windowed layers in two pools)",
        "moving both pools (the windowed layers' last window only) and rolling both back after a rejected draft",
    ),
    "HybridLinearKVPool": (
        "a hybrid linear-attention pool (recurrent state beside the KV)",
        "moving the recurrent state at full precision and snapshots of it to roll back to, "
        "since a state advanced on anchor KV cannot be undone",
    ),
}


def check_pool(pool) -> None:
    """Raise RuntimeError unless `pool` is a plain MHA pool Lynx can read and write."""
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool

    if not isinstance(pool, MHATokenToKVPool):
        raise RuntimeError(layout_refusal([cls.__name__ for cls in type(pool).__mro__], type(pool).__name__))
    if pool.store_dtype != pool.dtype or pool.dtype not in SUPPORTED_DTYPES:
        raise RuntimeError(
            f"the lynx transfer backend needs an unquantized bf16/fp16/fp32 KV cache; "
            f"got dtype {pool.dtype} stored as {pool.store_dtype} (drop --kv-cache-dtype)"
        )


def layout_refusal(class_names, shown: str) -> str:
    """Why the lynx backend refuses a KV layout (the first of `class_names` it knows), and what it would need."""
    known = next((name for name in class_names if name in UNSUPPORTED_LAYOUTS), None)
    what = shown
    if known is not None:
        layout, needed = UNSUPPORTED_LAYOUTS[known]
        what = f"{layout} ({shown}). Serving it would need {needed}"
    return (
        f"the lynx transfer backend moves per-head K/V caches (MHA/GQA); this model's KV cache is {what}. "
        f"Serve this model with another --disaggregation-transfer-backend."
    )


def head_shard(model_config, tp_size: int, tp_rank: int, pool) -> HeadShard:
    """Which of the model's KV heads `pool` holds on attention-TP rank `tp_rank` of `tp_size`.

    SGLang gives each rank a contiguous share. On a CPU it pads a head count the
    TP size does not divide with zero heads at the end (and records the real
    count on the HF config as ``original_total_num_kv_heads``); elsewhere it
    replicates heads when there are fewer than ranks.
    """
    real = getattr(model_config.hf_config, "original_total_num_kv_heads", None) or model_config.get_total_num_kv_heads()
    heads = int(pool.head_num)
    replicated = heads * tp_size > real and pool.k_buffer[0].device.type != "cpu"
    return HeadShard(int(tp_size), int(tp_rank), heads, int(real), replicated)
