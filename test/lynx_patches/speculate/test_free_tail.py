"""Rolling back a request's KV hands back whole pages only, with SGLang's own allocators."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator

from lynx_patches.speculate.verify import free_tail

POOL = 256


def _request(page: int, length: int):
    """A scheduler with SGLang's paged allocator and one request holding `length` slots."""
    allocator = PagedTokenToKVPoolAllocator(POOL, page, torch.bfloat16, "cpu", None, False)
    pages = -(-length // page)
    slots = allocator.alloc(pages * page)
    table = torch.zeros((1, POOL), dtype=torch.int32)
    table[0, : len(slots)] = slots.to(torch.int32)
    scheduler = SimpleNamespace(
        page_size=page, token_to_kv_pool_allocator=allocator,
        req_to_token_pool=SimpleNamespace(req_to_token=table),
    )  # fmt: skip
    req = SimpleNamespace(kv=SimpleNamespace(req_pool_idx=0, kv_allocated_len=length, kv_committed_len=length))
    return scheduler, req, allocator.available_size()


@pytest.mark.parametrize("page", [1, 16, 64])
@pytest.mark.parametrize("keep", [0, 1, 15, 16, 17, 63, 64, 70, 100])
def test_only_pages_wholly_past_keep_go_back(page, keep):
    scheduler, req, _ = _request(page, 100)
    kept_page_slots = scheduler.req_to_token_pool.req_to_token[0, :keep].clone()
    free_tail(scheduler, req, keep)
    allocator = scheduler.token_to_kv_pool_allocator
    held_pages = -(-keep // page)
    assert allocator.available_size() == POOL - held_pages * page
    assert (req.kv.kv_allocated_len, req.kv.kv_committed_len) == (keep, keep)
    # No slot the request still uses was handed back: allocating everything free
    # never returns one of them.
    fresh = allocator.alloc(allocator.available_size())
    assert not set(fresh.tolist()) & set(kept_page_slots.tolist())


def test_rolling_back_nothing_changes_nothing():
    scheduler, req, free_before = _request(16, 40)
    assert free_tail(scheduler, req, 40) == 0
    assert scheduler.token_to_kv_pool_allocator.available_size() == free_before
    assert req.kv.kv_allocated_len == 40
