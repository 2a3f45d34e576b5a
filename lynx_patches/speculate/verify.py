"""The verify pass: recompute a request's speculative tokens on full-precision KV.

A request with output ``[t0 .. tn]`` holds KV for the prompt (``P`` tokens)
and for ``t0 .. t(n-1)``, computed on the anchor. The pass is an ordinary
EXTEND forward of ``t0 .. t(n-1)`` on top of the ``P`` upgraded prompt
positions, writing into the request's existing slots, so any attention
backend that can prefill with a cached prefix serves it. The final hidden
states of all ``n`` positions are captured and turned into logits with the
model's own logits processor (the function decoding samples from).
"""

from __future__ import annotations

import torch


def verify_logits(scheduler, req, num_tokens: int) -> torch.Tensor:
    """Logits ``[num_tokens, vocab]`` after each of ``req.output_ids[:num_tokens]``.

    The KV of those tokens is rewritten in place in the request's slots
    ``P .. P + num_tokens - 1``.
    """
    from sglang.srt.layers.logits_processor import LogitsMetadata
    from sglang.srt.managers.schedule_batch import ScheduleBatch
    from sglang.srt.model_executor.forward_batch_info import (
        CaptureHiddenMode,
        ForwardBatch,
        ForwardMode,
    )
    from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo

    prompt = len(req.origin_input_ids)
    total = prompt + num_tokens
    row = req.kv.req_pool_idx
    pool = scheduler.req_to_token_pool
    device = pool.device
    batch = ScheduleBatch.init_new(
        [req],
        pool,
        scheduler.token_to_kv_pool_allocator,
        scheduler.tree_cache,
        scheduler.model_config,
        False,
        scheduler.spec_algorithm,
    )
    batch.forward_mode = ForwardMode.EXTEND
    batch.return_logprob = False
    batch.input_ids = torch.tensor(list(req.output_ids[:num_tokens]), dtype=torch.int64, device=device)
    batch.req_pool_indices = torch.tensor([row], dtype=torch.int64, device=device)
    batch.req_pool_indices_cpu = torch.tensor([row], dtype=torch.int64)
    batch.seq_lens = torch.tensor([total], dtype=torch.int64, device=device)
    batch.seq_lens_cpu = torch.tensor([total], dtype=torch.int64)
    batch.orig_seq_lens = torch.tensor([total], dtype=torch.int32, device=device)
    batch.seq_lens_sum = total
    batch.out_cache_loc = pool.req_to_token[row, prompt:total].to(torch.int64)
    batch.prefix_lens = [prompt]
    batch.extend_lens = [num_tokens]
    batch.extend_num_tokens = num_tokens
    batch.extend_logprob_start_lens = [num_tokens]
    batch.multimodal_inputs = [None]
    batch.sampling_info = SamplingBatchInfo.from_schedule_batch(batch, scheduler.model_config.vocab_size)

    runner = scheduler.tp_worker.model_runner
    forward_batch = ForwardBatch.init_new(
        batch, runner, capture_hidden_mode=CaptureHiddenMode.FULL, return_hidden_states_before_norm=False
    )
    result = scheduler.tp_worker.forward_batch_generation(None, forward_batch=forward_batch, is_verify=True)
    hidden = result.logits_output.hidden_states
    model = runner.model
    metadata = LogitsMetadata.from_forward_batch(forward_batch)
    return model.logits_processor._get_logits(hidden, model.lm_head, metadata)


def free_tail(scheduler, req, keep: int) -> int:
    """Free the request's KV slots at positions ``keep ..`` and shrink its lengths; returns slots freed."""
    allocated = req.kv.kv_allocated_len
    if keep >= allocated:
        return 0
    row = req.kv.req_pool_idx
    slots = scheduler.req_to_token_pool.req_to_token[row, keep:allocated].to(torch.int64)
    scheduler.token_to_kv_pool_allocator.free(slots)
    req.kv.kv_allocated_len = keep
    req.kv.kv_committed_len = min(req.kv.kv_committed_len, keep)
    return allocated - keep
