"""The sampler and stream hooks on their own (SGLang's side replaced by small stand-ins)."""

from __future__ import annotations

from types import SimpleNamespace

import torch
from lynx.request_lifecycle import Phase
from lynx.sampling import SamplingRule, draw

from lynx_patches.speculate import hooks
from lynx_patches.speculate.state import SpecState


def test_a_seeded_row_returns_its_drawn_token_with_that_tokens_logprob():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 40, generator=g)
    output = SimpleNamespace(next_token_logits=logits.clone(), next_token_logprobs=None)
    rule = SamplingRule(temperature=0.7)
    info = SimpleNamespace(lynx_coupled_rows=[(1, rule, 11, 4)])

    def original(sampler, out, sampling_info, *args, **kwargs):
        out.next_token_logprobs = torch.tensor([-1.0, -2.0])
        return torch.tensor([3, 5])

    tokens = hooks.sampler_forward(original, None, output, info)
    drawn = draw(logits[1], rule, 11, 4)
    assert tokens.tolist() == [3, drawn]
    expected = torch.log_softmax(logits[1] / 0.7, dim=-1)[drawn]
    assert torch.isclose(output.next_token_logprobs[1], expected) and output.next_token_logprobs[0] == -1.0


def _req(output_ids, sent, anchor, verified):
    state = SpecState(room=1, verified=verified, cap=4, phase=Phase.DRAFTING if anchor else Phase.EXACT)
    return SimpleNamespace(output_ids=list(output_ids), send_token_offset=sent, finished=lambda: False, lynx=state)


def test_held_back_tokens_and_empty_chunks_are_never_streamed():
    streamed = []

    def original(accumulator, *, req):
        streamed.append(req)

    held = _req([7, 1, 2], sent=1, anchor=True, verified=1)
    nothing_new = _req([7, 1, 2], sent=3, anchor=False, verified=3)
    fresh = _req([7, 1, 2, 3], sent=3, anchor=False, verified=4)
    first = _req([7], sent=0, anchor=True, verified=1)
    for req in (held, nothing_new, fresh, first):
        hooks.stream_accept(original, None, req=req)
    assert streamed == [fresh, first]


def test_a_receiver_without_a_lynx_side_is_left_to_sglang():
    scheduler = SimpleNamespace()
    decode_req = SimpleNamespace(req=SimpleNamespace(rid="warmup"), kv_receiver=SimpleNamespace())
    committed = hooks.commit_transfer(lambda queue, d: d.req.rid, SimpleNamespace(scheduler=scheduler), decode_req)
    assert committed == "warmup" and not hasattr(scheduler, hooks.CONTROLLER_ATTR)
