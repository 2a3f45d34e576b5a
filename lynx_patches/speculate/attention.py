"""Attention of an extend past a prefix under SGLang's `torch_native` backend: the new rows only.

`TorchNativeAttnBackend` serves an extend by padding each request's queries
to its whole sequence and running causal attention over all of it: a verify
pass of a handful of tokens on a 2k-token context would cost a 2k-token
prefill's attention, and each chunk of a chunked prefill the attention of
everything before it again. During a verify pass (`verify.VERIFYING`), and
on a Lynx server in every extend where a request has a prefix (a prefill
chunk after the first, a prefix-cache hit), the hook below attends from the
new rows only, each to every key up to its own position: ``m x L`` scores
instead of ``L x L``. A request without a prefix is computed exactly as
SGLang computes it.
"""

from __future__ import annotations

import torch
from torch.nn.functional import scaled_dot_product_attention

from lynx_patches.speculate.verify import VERIFYING
from lynx_patches.startup import current_config

LYNX_ATTR = "_lynx_new_rows"  # on the backend: whether this process serves with --lynx


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
    visible = None
    if prefix:  # without a prefix, SGLang's own call (a causal SDPA), bit for bit
        visible = torch.arange(total, device=query.device)[None, :] <= (prefix + torch.arange(rows, device=query.device))[:, None]
    out = scaled_dot_product_attention(
        query.movedim(0, 1).contiguous().unsqueeze(0),
        keys.movedim(0, 1).to(query.dtype).unsqueeze(0),
        values.movedim(0, 1).to(query.dtype).unsqueeze(0),
        attn_mask=visible,
        scale=scaling,
        enable_gqa=enable_gqa,
        is_causal=visible is None,
    )
    return out.squeeze(0).movedim(1, 0)


def _past_a_prefix(backend, forward_batch) -> bool:
    """Whether this is a Lynx server's extend in which some request has a prefix."""
    lynx = getattr(backend, LYNX_ATTR, None)
    if lynx is None:
        lynx = current_config() is not None
        setattr(backend, LYNX_ATTR, lynx)
    if not lynx:
        return False
    prefixes = forward_batch.extend_prefix_lens_cpu
    return prefixes is not None and any(prefixes)


def forward_extend(original, backend, q, k, v, layer, forward_batch, save_kv_cache=True, *args, **kwargs):
    """AROUND `TorchNativeAttnBackend.forward_extend`: a verify pass, and a Lynx server's extend past a
    prefix, attend from the new rows only."""
    if (
        layer.is_cross_attention
        or layer.sliding_window_size > -1
        or forward_batch.encoder_lens is not None
        or not (VERIFYING.get() or _past_a_prefix(backend, forward_batch))
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
