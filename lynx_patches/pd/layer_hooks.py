"""The hooks that stream a prefill forward's KV layer by layer.

`run_batch` (an AROUND hook on `Scheduler.run_batch`) hands the prefill side
the chunk each Lynx request computes in this forward; for the segments that
chunk completes the side returns a `lynx.pd.layers.ForwardLayers`, which the
`set_kv_buffer` hook advances layer by layer while the encoder thread encodes
and sends what is written.
"""

from __future__ import annotations

from collections.abc import Callable
from contextvars import ContextVar

import numpy as np

from lynx_patches import targets
from lynx_patches.pd.conn import LynxKVSender
from lynx_patches.pd.registry import manager_of
from lynx_patches.selfcheck import Hook


# Set by `run_batch` around a prefill forward that streams layers: called with the
# number of layers whose KV is written so far.
LAYERS_WRITTEN: ContextVar[Callable[[int], None] | None] = ContextVar("lynx_layers_written", default=None)


def computed_chunks(batch, req_to_token, page_size: int) -> list[tuple[int, np.ndarray]]:
    """``(room, slots)`` of each Lynx request of an extend batch that computes tokens the decode
    server lacks: the pool slots of its transfer positions from the first (past what the decode
    server already holds, `disagg_decode_prefix_len`) through the end of this chunk. Positions
    before `prefix_len` are cached or computed earlier; the side hands over only what it has not.
    A chunk whose slots the radix cache may swap after the forward (`may_be_deduplicated`) is left
    out: its segments are sent from the slots the chunk ends up in, once the forward is done."""
    chunks, earlier = [], []
    for req in batch.reqs:
        tokens = np.asarray(req.full_untruncated_fill_ids, dtype=np.int64)[: req.extend_end]
        skipped = req.disagg_decode_prefix_len
        streams = isinstance(req.disagg_kv_sender, LynxKVSender) and req.kv.req_pool_idx is not None
        if streams and req.extend_end > max(req.prefix_len, skipped):
            cap = req._compute_max_prefix_len(len(req.full_untruncated_fill_ids))
            if not may_be_deduplicated(tokens, req.prefix_len, cap, earlier, page_size):
                slots = req_to_token[req.kv.req_pool_idx, skipped : req.extend_end].cpu().numpy().astype(np.int64)
                chunks.append((req.bootstrap_room, slots))
        earlier.append(tokens)
    return chunks


def may_be_deduplicated(
    tokens: np.ndarray, prefix_len: int, cap: int, earlier: list[np.ndarray], page_size: int
) -> bool:
    """Whether the prefill's radix cache may hand a request other slots for tokens of the chunk it
    computes (`tokens[prefix_len:]`) when the chunk is inserted after the forward: where the tree
    already holds them, SGLang frees the chunk's own slots and points the request at the tree's.

    That happens when the prefix match stopped at its cap (`cap`: one token short of the prompt,
    or `logprob_start_len`) and not at the end of what the tree holds, e.g. a prompt sent again
    with prompt logprobs from its start, or a one-token prompt sent again; and when a request
    before it in the same batch (inserted first) computes the same tokens past `prefix_len`, e.g.
    the same new prompt twice in one batch. Conservative: it may say yes where the tree holds
    nothing."""
    if cap // page_size * page_size <= prefix_len:
        return True
    reach = prefix_len + page_size  # the insert dedups whole pages only
    for other in earlier:
        n = min(len(other), len(tokens))
        if n < reach:
            continue
        parted = np.flatnonzero(other[:n] != tokens[:n])
        if (parted[0] if len(parted) else n) >= reach:
            return True
    return False


def streams_layers_of(batch) -> bool:
    """Whether a forward of `batch` may report its layers as written: an extend forward run whole,
    not split across calls (PD multiplexing) nor into two overlapped micro-batches, whose second
    writes a layer after the first reported it."""
    mode = batch.forward_mode
    return mode.is_extend() and not mode.is_split_prefill() and getattr(batch, "tbo_split_seq_index", None) is None


def run_batch(original, scheduler, batch, *args, **kwargs):
    """AROUND `Scheduler.run_batch`: on a Lynx prefill server, the segments this forward completes
    are encoded and sent layer by layer while it runs."""
    manager = manager_of(scheduler)
    prefill = manager is not None and not manager.is_decode and manager.side.streams_layers
    if not prefill or batch is None or not streams_layers_of(batch):
        return original(scheduler, batch, *args, **kwargs)
    layers = manager.side.begin_forward(
        computed_chunks(batch, scheduler.req_to_token_pool.req_to_token, scheduler.page_size)
    )
    if layers is None:
        return original(scheduler, batch, *args, **kwargs)
    token = LAYERS_WRITTEN.set(layers.written)
    completed = False
    try:
        result = original(scheduler, batch, *args, **kwargs)
        completed = True
        return result
    finally:
        LAYERS_WRITTEN.reset(token)
        layers.finish(completed)


def kv_written(result, pool, layer, *args, **kwargs):
    """AFTER `MHATokenToKVPool.set_kv_buffer`: in a streaming prefill forward, layer `layer` is written."""
    notify = LAYERS_WRITTEN.get()
    if notify is not None and layer is not None:
        notify(layer.layer_id - pool.start_layer + 1)
    return None


HOOKS = (
    Hook(targets.SCHEDULER_RUN_BATCH, run_batch, "AROUND"),
    Hook(targets.MHA_SET_KV_BUFFER, kv_written, "AFTER"),
)
