"""The verify pass's attention against SGLang's own `torch_native` extend (the plain-PyTorch reference)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from lynx_patches.speculate.attention import attend_new_rows, forward_extend
from lynx_patches.speculate.verify import VERIFYING

HEADS, KV_HEADS, DIM = 6, 2, 16


def _reference(query, keys, values, prefix):
    """SGLang's `TorchNativeAttnBackend._run_sdpa_forward_extend` for one request."""
    from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend

    rows, total = query.shape[0], keys.shape[0]
    out = torch.empty_like(query)
    TorchNativeAttnBackend._run_sdpa_forward_extend(
        None, query, out, keys, values,
        req_to_token=torch.arange(total)[None, :], req_pool_indices=torch.tensor([0]),
        seq_lens=torch.tensor([total]), extend_prefix_lens=torch.tensor([prefix]),
        extend_seq_lens=torch.tensor([rows]), scaling=DIM**-0.5, enable_gqa=True, causal=True,
    )  # fmt: skip
    return out


@pytest.mark.parametrize("prefix,rows", [(0, 5), (37, 1), (200, 16)])
def test_new_rows_attend_exactly_like_the_padded_causal_extend(prefix, rows):
    g = torch.Generator().manual_seed(prefix + rows)
    query = torch.randn(rows, HEADS, DIM, generator=g)
    keys = torch.randn(prefix + rows, KV_HEADS, DIM, generator=g).to(torch.bfloat16)
    values = torch.randn(prefix + rows, KV_HEADS, DIM, generator=g).to(torch.bfloat16)
    got = attend_new_rows(query, keys, values, prefix, DIM**-0.5, enable_gqa=True)
    torch.testing.assert_close(got, _reference(query, keys, values, prefix), rtol=1e-5, atol=1e-5)


def test_rows_without_a_prefix_are_computed_bit_for_bit_as_sglang_computes_them():
    g = torch.Generator().manual_seed(5)
    query = torch.randn(33, HEADS, DIM, generator=g)
    keys = torch.randn(33, KV_HEADS, DIM, generator=g).to(torch.bfloat16)
    values = torch.randn(33, KV_HEADS, DIM, generator=g).to(torch.bfloat16)
    assert torch.equal(attend_new_rows(query, keys, values, 0, DIM**-0.5, True), _reference(query, keys, values, 0))


def test_noncontiguous_query_rows_are_accepted():
    g = torch.Generator().manual_seed(3)
    wide = torch.randn(4, HEADS, 2 * DIM, generator=g)
    query = wide[..., :DIM]
    keys = torch.randn(10, KV_HEADS, DIM, generator=g)
    values = torch.randn(10, KV_HEADS, DIM, generator=g)
    got = attend_new_rows(query, keys, values, 6, None, enable_gqa=True)
    torch.testing.assert_close(got, _reference(query.contiguous(), keys, values, 6), rtol=1e-5, atol=1e-5)


def test_key_count_must_cover_the_prefix_and_the_rows():
    with pytest.raises(ValueError, match="need 12 keys"):
        attend_new_rows(torch.zeros(2, HEADS, DIM), torch.zeros(11, KV_HEADS, DIM), torch.zeros(11, KV_HEADS, DIM), 10, None, True)


class _Pool:
    def __init__(self, k, v):
        self.k, self.v, self.written = k, v, []

    def set_kv_buffer(self, layer, loc, k, v):
        self.written.append(loc)

    def get_key_buffer(self, layer_id):
        return self.k

    def get_value_buffer(self, layer_id):
        return self.v


def test_the_hook_serves_a_verify_pass_of_two_requests_and_leaves_other_extends_alone():
    g = torch.Generator().manual_seed(7)
    slots = 40
    k = torch.randn(slots, KV_HEADS, DIM, generator=g)
    v = torch.randn(slots, KV_HEADS, DIM, generator=g)
    req_to_token = torch.stack([torch.arange(slots), torch.arange(slots).flip(0)])
    backend = SimpleNamespace(token_to_kv_pool=_Pool(k, v), swa_out_cache_loc=None,
                              req_to_token_pool=SimpleNamespace(req_to_token=req_to_token))  # fmt: skip
    layer = SimpleNamespace(tp_q_head_num=HEADS, tp_k_head_num=KV_HEADS, qk_head_dim=DIM, v_head_dim=DIM,
                            scaling=DIM**-0.5, is_cross_attention=False, sliding_window_size=-1, layer_id=0)  # fmt: skip
    batch = SimpleNamespace(req_pool_indices=torch.tensor([0, 1]), seq_lens=torch.tensor([12, 20]),
                            extend_seq_lens=torch.tensor([3, 2]), out_cache_loc=torch.arange(5), encoder_lens=None)  # fmt: skip
    q = torch.randn(5, HEADS * DIM, generator=g)
    marked = VERIFYING.set(True)
    out = forward_extend(None, backend, q, None, None, layer, batch).view(5, HEADS, DIM)
    VERIFYING.reset(marked)
    first = attend_new_rows(q.view(5, HEADS, DIM)[:3], k[:12], v[:12], 9, DIM**-0.5, True)
    second_slots = req_to_token[1, :20]
    second = attend_new_rows(q.view(5, HEADS, DIM)[3:], k[second_slots], v[second_slots], 18, DIM**-0.5, True)
    torch.testing.assert_close(out, torch.cat([first, second]))

    calls = []
    forward_extend(lambda *a, **kw: calls.append(a) or "original", backend, q, None, None, layer, batch)
    assert len(calls) == 1


def test_on_a_lynx_server_an_extend_past_a_prefix_attends_from_its_new_rows_only():
    """A later prefill chunk (request 0: 9 tokens before its 3 new ones) beside a request without a
    prefix (request 1, computed as SGLang computes it); an extend where no request has a prefix,
    or a server without --lynx, runs SGLang's own code."""
    from lynx_patches.speculate.attention import LYNX_ATTR

    g = torch.Generator().manual_seed(8)
    k = torch.randn(40, KV_HEADS, DIM, generator=g)
    v = torch.randn(40, KV_HEADS, DIM, generator=g)
    req_to_token = torch.stack([torch.arange(40), torch.arange(40).flip(0)])
    backend = SimpleNamespace(token_to_kv_pool=_Pool(k, v), swa_out_cache_loc=None,
                              req_to_token_pool=SimpleNamespace(req_to_token=req_to_token))  # fmt: skip
    setattr(backend, LYNX_ATTR, True)
    layer = SimpleNamespace(tp_q_head_num=HEADS, tp_k_head_num=KV_HEADS, qk_head_dim=DIM, v_head_dim=DIM,
                            scaling=DIM**-0.5, is_cross_attention=False, sliding_window_size=-1, layer_id=0)  # fmt: skip
    batch = SimpleNamespace(req_pool_indices=torch.tensor([0, 1]), seq_lens=torch.tensor([12, 4]),
                            extend_seq_lens=torch.tensor([3, 4]), extend_prefix_lens_cpu=[9, 0],
                            out_cache_loc=torch.arange(7), encoder_lens=None)  # fmt: skip
    q = torch.randn(7, HEADS * DIM, generator=g)
    out = forward_extend(None, backend, q, None, None, layer, batch).view(7, HEADS, DIM)
    rows = q.view(7, HEADS, DIM)
    torch.testing.assert_close(out[:3], _reference(rows[:3], k[:12], v[:12], 9), rtol=1e-5, atol=1e-5)
    second = req_to_token[1, :4]
    assert torch.equal(out[3:], _reference(rows[3:], k[second], v[second], 0))

    calls = []
    original = lambda *a, **kw: calls.append(a) or "original"  # noqa: E731
    forward_extend(original, backend, q, None, None, layer, SimpleNamespace(**{**vars(batch), "extend_prefix_lens_cpu": [0, 0]}))
    setattr(backend, LYNX_ATTR, False)
    forward_extend(original, backend, q, None, None, layer, batch)
    assert len(calls) == 2
