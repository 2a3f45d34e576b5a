"""`PoolView`: what the Lynx data path may see of one rank's KV pool and metadata rows."""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import numpy as np
import torch
from lynx.heads import HeadShard
from lynx.kvwire import KVShape

SUPPORTED_DTYPES = (torch.bfloat16, torch.float16, torch.float32)



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
        """The view of an MHA pool (per-layer `k_buffer`/`v_buffer`, `page_size`) and a PD manager's
        `KVArgs` (page size, metadata buffers); the caller has checked the pool is one Lynx serves."""
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
