"""`--lynx-loopback`: a single server that round-trips each prompt's KV through the wire format.

Right after a request's prefill, its prompt KV is encoded in the server's
`--lynx-mode` and decoded back into the same slots, so decoding continues on
exactly the KV a decode server would have received. The first token still
comes from the exact prefill, as in disaggregated serving. This measures a
mode's accuracy on one server, and is the reference the PD tests compare to.
"""

from __future__ import annotations

import torch
from lynx.pd.pool import PoolView

from lynx_patches import targets
from lynx_patches.pd.pool import check_pool
from lynx_patches.selfcheck import Hook
from lynx_patches.startup import current_config


def roundtrip(wire, pool: PoolView, slots: torch.Tensor) -> None:
    """Replace the KV at `slots` (int64 ``[tokens]``) by its wire-format round trip."""
    streams = wire.encode(pool.k_buffers, pool.v_buffers, slots)
    wire.write(streams, pool.shape(len(slots)), pool.k_buffers, pool.v_buffers, slots)


def prefill_result(result, processor, batch, *args, **kwargs):
    """AFTER `SchedulerBatchResultProcessor.process_batch_result_prefill`."""
    config = current_config()
    if config is None or not config.loopback:
        return None
    kvcache = processor.token_to_kv_pool_allocator.get_kvcache()
    check_pool(kvcache)
    pool = PoolView.of(kvcache)
    for req in batch.reqs:
        # A chunk short of the prompt's end is a middle chunk: SGLang has already counted it off
        # `inflight_middle_chunks` when this hook runs, and the row past the chunk has no slots yet.
        short = req.extend_end is not None and req.extend_end < len(req.origin_input_ids)
        middle = req.inflight_middle_chunks > 0 or short
        if req.finished() or middle or getattr(req, "_lynx_roundtripped", False):
            continue
        row = processor.req_to_token_pool.req_to_token[req.kv.req_pool_idx]
        roundtrip(config.wire, pool, row[: len(req.origin_input_ids)].to(torch.int64))
        req._lynx_roundtripped = True
    return None


HOOKS = (Hook(targets.PREFILL_RESULT, prefill_result, "AFTER"),)
