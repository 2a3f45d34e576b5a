"""The verify pass: recompute the tokens of several requests on full-precision KV, in one forward.

A request in its anchor phase with output ``[t0 .. tn]`` holds KV for its
prompt (``P`` tokens, upgraded to full precision before the pass) and for
``t0 .. t(n-1)``, computed on the anchor. The pass is one EXTEND forward over
every request's ``t0 .. t(n-1)`` on top of its ``P`` prompt positions,
writing into the request's existing slots. The final hidden states of all
positions are turned into logits with the model's own logits processor.

While the pass runs, `VERIFYING` is set (a context variable: SGLang's runners
copy the forward batch field by field, so a mark on it would not reach the
attention layers), so that attention backends which would recompute the
whole context for an extend (SGLang's `torch_native`) attend only from the
few new positions (`lynx_patches.speculate.attention`).
"""

from __future__ import annotations

import contextvars
from typing import NamedTuple

import torch

VERIFYING = contextvars.ContextVar("lynx_verifying", default=False)


class Span(NamedTuple):
    """Rows of one request in a verify pass: its output tokens ``start .. start + count - 1``.

    Row ``i`` recomputes the KV of output token ``start + i`` and yields the
    logits of the token after it (output index ``start + i + 1``).
    """

    req: object
    start: int
    count: int


def verify_logits(scheduler, spans: list[Span]) -> torch.Tensor:
    """Logits ``[sum(count), vocab]`` of every span's rows, spans in order.

    The KV of each span's tokens is rewritten in place in its request's slots.
    """
    from sglang.srt.layers.logits_processor import LogitsMetadata
    from sglang.srt.managers.schedule_batch import ScheduleBatch
    from sglang.srt.model_executor.forward_batch_info import (
        CaptureHiddenMode,
        ForwardBatch,
        ForwardMode,
    )
    from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo

    pool = scheduler.req_to_token_pool
    device = pool.device
    reqs = [span.req for span in spans]
    batch = ScheduleBatch.init_new(
        reqs,
        pool,
        scheduler.token_to_kv_pool_allocator,
        scheduler.tree_cache,
        scheduler.model_config,
        False,
        scheduler.spec_algorithm,
    )
    rows, prefix_lens, seq_lens, tokens, slots = [], [], [], [], []
    for req, start, count in spans:
        prefix = len(req.origin_input_ids) + start
        row = req.kv.req_pool_idx
        rows.append(row)
        prefix_lens.append(prefix)
        seq_lens.append(prefix + count)
        tokens.extend(req.output_ids[start : start + count])
        slots.append(pool.req_to_token[row, prefix : prefix + count].to(torch.int64))
    counts = [span.count for span in spans]
    batch.forward_mode = ForwardMode.EXTEND
    batch.return_logprob = False
    batch.input_ids = torch.tensor(tokens, dtype=torch.int64, device=device)
    batch.req_pool_indices = torch.tensor(rows, dtype=torch.int64, device=device)
    batch.req_pool_indices_cpu = torch.tensor(rows, dtype=torch.int64)
    batch.seq_lens = torch.tensor(seq_lens, dtype=torch.int64, device=device)
    batch.seq_lens_cpu = torch.tensor(seq_lens, dtype=torch.int64)
    batch.orig_seq_lens = torch.tensor(seq_lens, dtype=torch.int32, device=device)
    batch.seq_lens_sum = sum(seq_lens)
    batch.out_cache_loc = torch.cat(slots)
    batch.prefix_lens = prefix_lens
    batch.extend_lens = counts
    batch.extend_num_tokens = sum(counts)
    batch.extend_logprob_start_lens = counts
    batch.multimodal_inputs = [None] * len(spans)
    batch.sampling_info = SamplingBatchInfo.from_schedule_batch(batch, scheduler.model_config.vocab_size)

    runner = scheduler.tp_worker.model_runner
    forward_batch = ForwardBatch.init_new(
        batch, runner, capture_hidden_mode=CaptureHiddenMode.FULL, return_hidden_states_before_norm=False
    )
    marked = VERIFYING.set(True)
    try:
        result = scheduler.tp_worker.forward_batch_generation(None, forward_batch=forward_batch, is_verify=True)
    finally:
        VERIFYING.reset(marked)
    hidden = result.logits_output.hidden_states
    model = runner.model
    metadata = LogitsMetadata.from_forward_batch(forward_batch)
    return model.logits_processor._get_logits(hidden, model.lm_head, metadata, use_logits_buffer=False)


def free_tail(scheduler, req, keep: int) -> int:
    """Shrink the request's KV to its first `keep` positions; returns slots handed back.

    SGLang's allocator frees whole pages (every page a freed slot lies in), so
    only the pages wholly past `keep` go back; the slots after `keep` in its
    last page stay with the request, where its next decode step writes, as
    after `keep` tokens of plain decoding.
    """
    allocated = req.kv.kv_allocated_len
    page = scheduler.page_size
    first_free = -(-keep // page) * page
    if keep < allocated:
        req.kv.kv_allocated_len = keep
        req.kv.kv_committed_len = min(req.kv.kv_committed_len, keep)
    if first_free >= allocated:
        return 0
    row = req.kv.req_pool_idx
    slots = scheduler.req_to_token_pool.req_to_token[row, first_free:allocated].to(torch.int64)
    scheduler.token_to_kv_pool_allocator.free(slots)
    return allocated - first_free
