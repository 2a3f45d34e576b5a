"""`PoolView`: what the Lynx data path may see of one rank's SGLang KV pool and metadata rows."""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import numpy as np
import torch
from lynx.heads import HeadShard
from lynx.kvwire import KVShape

SUPPORTED_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


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


def page_slots(pages: np.ndarray, page_size: int, num_tokens: int) -> np.ndarray:
    """Token slots of the first `num_tokens` tokens stored in `pages` (int64)."""
    pages = np.asarray(pages, dtype=np.int64)
    if num_tokens > len(pages) * page_size:
        raise ValueError(f"{num_tokens} tokens do not fit in {len(pages)} pages of {page_size}")
    slots = (pages[:, None] * page_size + np.arange(page_size)[None, :]).reshape(-1)
    return slots[:num_tokens]


@dataclass(frozen=True)
class PoolView:
    """Per-layer K/V buffers (each ``[slots, kv_heads, head_dim]``), page size and metadata rows.

    The view never frees or allocates: whoever holds a request's slots decides
    when they may be written (see `lynx.transfer.rooms`). `heads` says which of
    the model's KV heads the buffers hold (a tensor-parallel rank's share); None
    is all of them.
    """

    k_buffers: tuple[torch.Tensor, ...]
    v_buffers: tuple[torch.Tensor, ...]
    page_size: int
    aux_ptrs: tuple[int, ...]
    aux_item_lens: tuple[int, ...]
    heads: HeadShard | None = None

    @classmethod
    def of(cls, pool, kv_args=None, heads: HeadShard | None = None) -> PoolView:
        """The view of an SGLang MHA pool and a PD manager's `KVArgs` (page size, metadata buffers)."""
        check_pool(pool)
        if kv_args is None:
            return cls(tuple(pool.k_buffer), tuple(pool.v_buffer), int(pool.page_size), (), (), heads)
        return cls(
            tuple(pool.k_buffer),
            tuple(pool.v_buffer),
            int(kv_args.page_size),
            tuple(int(p) for p in kv_args.aux_data_ptrs),
            tuple(int(n) for n in kv_args.aux_item_lens),
            heads,
        )

    @property
    def shard(self) -> HeadShard:
        """The heads these buffers hold (every head of the model, on one rank, if not told)."""
        if self.heads is not None:
            return self.heads
        kv_heads = self.k_buffers[0].shape[1]
        return HeadShard(1, 0, kv_heads, kv_heads)

    def head_buffers(self, offset: int, count: int) -> tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]]:
        """Per-layer K and V views of `count` local heads from `offset` (the buffers themselves if all)."""
        if (offset, count) == (0, self.k_buffers[0].shape[1]):
            return self.k_buffers, self.v_buffers
        return (
            tuple(b[:, offset : offset + count] for b in self.k_buffers),
            tuple(b[:, offset : offset + count] for b in self.v_buffers),
        )

    @property
    def device(self) -> torch.device:
        return self.k_buffers[0].device

    @property
    def aux_size(self) -> int:
        return sum(self.aux_item_lens)

    def shape(self, num_tokens: int, kv_heads: int | None = None) -> KVShape:
        """The KV shape of `num_tokens` tokens in this pool (of `kv_heads` of its heads; all if None)."""
        first = self.k_buffers[0]
        heads = first.shape[1] if kv_heads is None else kv_heads
        return KVShape(len(self.k_buffers), num_tokens, heads, first.shape[2], first.dtype)

    def slot_index(self, slots: np.ndarray) -> torch.Tensor:
        """Token slots as an int64 index tensor on the pool's device."""
        return torch.from_numpy(np.asarray(slots, dtype=np.int64)).to(self.device)

    def read_aux(self, index: int) -> bytes:
        """The request's row of every metadata buffer, concatenated."""
        return b"".join(
            bytes((ctypes.c_byte * n).from_address(ptr + n * index)) for ptr, n in zip(self.aux_ptrs, self.aux_item_lens)
        )

    def write_aux(self, index: int, data) -> None:
        """Write a request's metadata rows (as `read_aux` produced them) into row `index`."""
        view = memoryview(data).cast("B")
        if len(view) != self.aux_size:
            raise ValueError(f"aux data of {len(view)} bytes, buffers need {self.aux_size}")
        offset = 0
        for ptr, n in zip(self.aux_ptrs, self.aux_item_lens):
            ctypes.memmove(ptr + n * index, bytes(view[offset : offset + n]), n)
            offset += n

    def synchronize(self) -> None:
        """Make this thread's writes visible to every stream before reporting them (GPU pools)."""
        if self.device.type == "cuda":
            torch.cuda.current_stream(self.device).synchronize()


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
