"""Access to an SGLang MHA KV pool and metadata (aux) buffers for the Lynx data path."""

from __future__ import annotations

import ctypes

import torch

SUPPORTED_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def check_pool(pool) -> None:
    """Raise RuntimeError unless `pool` is a plain MHA pool Lynx can read and write."""
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool

    if not isinstance(pool, MHATokenToKVPool):
        raise RuntimeError(
            f"the lynx transfer backend supports MHA KV pools; this model uses {type(pool).__name__}"
        )
    if pool.store_dtype != pool.dtype or pool.dtype not in SUPPORTED_DTYPES:
        raise RuntimeError(
            f"the lynx transfer backend needs an unquantized bf16/fp16/fp32 KV cache; "
            f"got dtype {pool.dtype} stored as {pool.store_dtype} (drop --kv-cache-dtype)"
        )


def layer_buffers(pool) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Per-layer K and V buffers, each ``[pool_slots, kv_heads, head_dim]``."""
    return list(pool.k_buffer), list(pool.v_buffer)


def read_aux(kv_args, aux_index: int) -> bytes:
    """The request's row of every metadata buffer, concatenated."""
    rows = []
    for ptr, item_len in zip(kv_args.aux_data_ptrs, kv_args.aux_item_lens):
        rows.append(bytes((ctypes.c_byte * item_len).from_address(ptr + item_len * aux_index)))
    return b"".join(rows)


def write_aux(kv_args, aux_index: int, data) -> None:
    """Write a request's metadata rows (as `read_aux` produced them) into row `aux_index`."""
    view = memoryview(data).cast("B")
    if len(view) != sum(kv_args.aux_item_lens):
        raise ValueError(f"aux data of {len(view)} bytes, buffers need {sum(kv_args.aux_item_lens)}")
    offset = 0
    for ptr, item_len in zip(kv_args.aux_data_ptrs, kv_args.aux_item_lens):
        ctypes.memmove(ptr + item_len * aux_index, bytes(view[offset : offset + item_len]), item_len)
        offset += item_len
