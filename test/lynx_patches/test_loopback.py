"""`--lynx-loopback`: each prompt's KV round-trips once, after the chunk that ends the prompt."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from lynx_patches import loopback


def _req(prompt_tokens: int, extend_end: int) -> SimpleNamespace:
    return SimpleNamespace(origin_input_ids=list(range(prompt_tokens)), extend_end=extend_end, inflight_middle_chunks=0,
                           kv=SimpleNamespace(req_pool_idx=0), finished=lambda: False)  # fmt: skip


def test_a_chunked_prompt_round_trips_after_its_last_chunk_only(monkeypatch):
    row = torch.zeros(2048, dtype=torch.int32)
    row[:512] = torch.arange(100, 612)  # the first chunk's slots; the rest not allocated yet
    processor = SimpleNamespace(token_to_kv_pool_allocator=SimpleNamespace(get_kvcache=lambda: None),
                                req_to_token_pool=SimpleNamespace(req_to_token=row[None]))  # fmt: skip
    trips = []
    monkeypatch.setattr(loopback, "current_config", lambda: SimpleNamespace(loopback=True, wire=None))
    monkeypatch.setattr(loopback, "check_pool", lambda kvcache: None)
    monkeypatch.setattr(loopback.PoolView, "of", staticmethod(lambda kvcache: None))
    monkeypatch.setattr(loopback, "roundtrip", lambda wire, pool, slots: trips.append(slots.clone()))
    req = _req(1089, 512)  # SGLang counted the middle chunk off `inflight_middle_chunks` before this hook
    loopback.prefill_result(None, processor, SimpleNamespace(reqs=[req]))
    assert trips == [], "a middle chunk must not round-trip the row's unallocated slots"
    row[512:1089] = torch.arange(612, 1189)
    req.extend_end = 1089
    loopback.prefill_result(None, processor, SimpleNamespace(reqs=[req]))
    loopback.prefill_result(None, processor, SimpleNamespace(reqs=[req]))
    assert len(trips) == 1 and torch.equal(trips[0], torch.arange(100, 1189))
