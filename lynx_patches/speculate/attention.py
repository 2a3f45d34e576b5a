"""Attention of a verify pass under SGLang's `torch_native` backend: the new rows only.

`TorchNativeAttnBackend` serves an extend by padding each request's queries
to its whole sequence and running causal attention over all of it: a verify
pass of a handful of tokens on a 2k-token context would cost a 2k-token
prefill's attention. During a verify pass (`verify.VERIFYING`), the
hook below attends from the new rows only, each to every key up to its own
position: ``m x L`` scores instead of ``L x L``, the work of ``m`` decode steps.
"""

from __future__ import annotations

import torch
from torch.nn.functional import scaled_dot_product_attention

from lynx_patches.speculate.verify import VERIFYING


def attend_new_rows(
    query: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    prefix: int,
    scaling: float | None,
    enable_gqa: bool,
) -> torch.Tensor:
    """Causal attention of the last ``m`` positions of a sequence of ``L``.

    Args:
        query: ``[m, heads, dim]``, positions ``prefix .. prefix + m - 1``.
        keys, values: ``[L, kv_heads, dim]`` with ``L = prefix + m``.
        prefix: positions before the first query row.

    Returns:
        ``[m, heads, dim]``: row i attends to keys ``0 .. prefix + i``.
    """
    rows, total = query.shape[0], keys.shape[0]
    if total != prefix + rows:
        raise ValueError(f"{rows} query rows after {prefix} positions need {prefix + rows} keys, got {total}")
    visible = torch.arange(total, device=query.device)[None, :] <= (prefix + torch.arange(rows, device=query.device))[:, None]
    keys, values = keys.to(query.dtype), values.to(query.dtype)
    out = scaled_dot_product_attention(
        query.movedim(0, 1).unsqueeze(0),
        keys.movedim(0, 1).unsqueeze(0),
        values.movedim(0, 1).unsqueeze(0),
        attn_mask=visible,
        scale=scaling,
        enable_gqa=enable_gqa,
    )
    return out.squeeze(0).movedim(1, 0)


def forward_extend(original, backend, q, k, v, layer, forward_batch, save_kv_cache=True, *args, **kwargs):
    """AROUND `TorchNativeAttnBackend.forward_extend`: a verify pass attends from its new rows only."""
    if (
        not VERIFYING.get()
        or layer.is_cross_attention
        or layer.sliding_window_size > -1
        or forward_batch.encoder_lens is not None
    ):
        return original(backend, q, k, v, layer, forward_batch, save_kv_cache, *args, **kwargs)
    from sglang.srt.mem_cache.memory_pool import KVWriteLoc

    if save_kv_cache and k is not None and v is not None:
        loc = KVWriteLoc(forward_batch.out_cache_loc, backend.swa_out_cache_loc)
        backend.token_to_kv_pool.set_kv_buffer(layer, loc, k, v)
    query = q.view(-1, layer.tp_q_head_num, layer.qk_head_dim)
    out = q.new_empty((query.shape[0], layer.tp_q_head_num, layer.v_head_dim))
    k_cache = backend.token_to_kv_pool.get_key_buffer(layer.layer_id)
    v_cache = backend.token_to_kv_pool.get_value_buffer(layer.layer_id)
    req_to_token = backend.req_to_token_pool.req_to_token
    gqa = layer.tp_q_head_num != layer.tp_k_head_num
    start = 0
    for row, seq_len, new in zip(
        forward_batch.req_pool_indices.tolist(),
        forward_batch.seq_lens.tolist(),
        forward_batch.extend_seq_lens.tolist(),
        strict=True,
    ):
        slots = req_to_token[row, :seq_len]
        out[start : start + new] = attend_new_rows(
            query[start : start + new], k_cache[slots], v_cache[slots], seq_len - new, layer.scaling, gqa
        )
        start += new
    return out.view(-1, layer.tp_q_head_num * layer.v_head_dim)
