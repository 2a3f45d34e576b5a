"""`SpecController` against a fake scheduler, a real `DecodeSide` on a fake pool, and a scripted verify pass.

The verify forward (an SGLang model pass) is replaced by logits that predict
chosen tokens, and KV release by a recorder; everything else (the room table,
parking, rollback arithmetic, failure) is the real code.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from lynx.transfer.keys import transfer_key
from pd_fakes import SECRET, DecodeHost, FakePool, config, transfer_messages

from lynx_patches.pd.decode_side import DecodeSide
from lynx_patches.speculate import controller as controller_module
from lynx_patches.speculate.controller import SpecController
from lynx_patches.speculate.state import state_of

VOCAB = 50
PROMPT = 20


@dataclass
class Req:
    rid: str
    bootstrap_room: int
    output_ids: list
    max_new_tokens: int = 64
    origin_input_ids: list = field(default_factory=lambda: list(range(PROMPT)))
    finished_reason: object = None
    skip_radix_cache_insert: bool = False
    return_logprob: bool = False
    grammar: object = None
    customized_info: dict | None = None
    to_finish: object = None

    def __post_init__(self):
        self.sampling_params = SimpleNamespace(
            max_new_tokens=self.max_new_tokens, temperature=0.0, top_k=-1, top_p=1.0, min_p=0.0,
            logit_bias=None, frequency_penalty=0.0, presence_penalty=0.0, repetition_penalty=1.0,
            min_new_tokens=0, json_schema=None, regex=None, ebnf=None, structural_tag=None, sampling_seed=None,
        )  # fmt: skip

    def finished(self):
        return self.finished_reason is not None

    def update_finish_state(self, new_accepted_len=1):
        if len(self.output_ids) >= self.sampling_params.max_new_tokens:
            self.finished_reason = "length"


class Batch:
    def __init__(self, reqs):
        self.reqs = list(reqs)

    def filter_batch(self, keep_indices):
        self.reqs = [self.reqs[i] for i in keep_indices]

    def is_empty(self):
        return not self.reqs


class Scheduler:
    def __init__(self):
        self.waiting_queue = []
        self.metrics_reporter = SimpleNamespace(enable_metrics=False)
        self.tree_cache = object()
        self.streamed = []
        self.output_streamer = SimpleNamespace(stream_output=lambda reqs, _: self.streamed.extend(reqs))


@pytest.fixture
def world(monkeypatch):
    """A controller on a real decode side; `released` records KV releases, `freed` tail frees."""
    clock = SimpleNamespace(now=0.0)
    side = DecodeSide(config(max_speculative_tokens=3, transfer_timeout=10.0), SECRET, DecodeHost(), "127.0.0.1", clock=lambda: clock.now)
    side.attach(FakePool(seed=1).view)
    scheduler = Scheduler()
    released, freed, predictions = [], [], {}
    monkeypatch.setattr("sglang.srt.mem_cache.common.release_kv_cache", lambda req, tree, checkpoint: released.append((req.rid, checkpoint)))
    monkeypatch.setattr(controller_module, "free_tail", lambda sched, req, keep: freed.append((req.rid, keep)))
    monkeypatch.setattr(controller_module, "verify_logits", lambda sched, req, n: _logits(predictions[req.rid][:n]))
    world = SimpleNamespace(
        side=side, scheduler=scheduler, controller=SpecController(scheduler, side), clock=clock,
        released=released, freed=freed, predictions=predictions,
    )  # fmt: skip
    yield world
    side.close()


def _logits(tokens):
    logits = torch.full((len(tokens), VOCAB), -10.0)
    logits[torch.arange(len(tokens)), torch.tensor(tokens)] = 10.0
    return logits


def admit(world, rid, room, first_token=7):
    """A request whose anchor landed: its room anchored on the side, adopted by the controller."""
    side = world.side
    assert side.claim(room)
    nonce = side.reserve(room, np.arange(PROMPT), 0, 0.0, "prefill", ())
    key = transfer_key(SECRET, nonce)
    manifest, frames = transfer_messages(side.config, FakePool(seed=0), range(PROMPT), room, key, bytes(24))
    for parts in [manifest.seal(key), *frames[255], *frames[0]]:
        side._on_message(parts)
    side.rooms.hand_over(room)
    req = Req(rid, room, [first_token])
    world.controller.adopt(req, residual_pending=True, timings=side.rooms.timings(room))
    return req, frames


def land_residual(world, room, frames):
    for parts in frames[1]:
        world.side._on_message(parts)


def test_a_request_that_drafted_its_cap_is_parked_until_its_residual_lands(world):
    req, _ = admit(world, "a", 1)
    batch = Batch([req])
    req.output_ids += [1, 2]
    world.controller.before_schedule(batch)
    assert batch.reqs == [req] and not world.controller.busy
    req.output_ids += [3]
    world.controller.before_schedule(batch)
    assert batch.reqs == [] and world.controller.parked == [req] and state_of(req).parked


def test_drafts_that_full_precision_agrees_with_are_all_kept_and_verified(world):
    req, frames = admit(world, "a", 1)
    req.output_ids += [1, 2, 3]
    world.predictions["a"] = [1, 2, 3]
    batch = Batch([req])
    world.controller.before_schedule(batch)  # parks at the cap
    land_residual(world, 1, frames)
    world.controller.before_schedule(batch)
    assert req.output_ids == [7, 1, 2, 3] and state_of(req).verified == 4 and not state_of(req).anchor
    assert world.scheduler.waiting_queue == [req] and world.controller.parked == []
    metrics = world.controller.metrics(req)
    assert (metrics["speculative_tokens"], metrics["accepted_tokens"], metrics["rollbacks"]) == (3, 3, 0)
    assert metrics["anchor_ready_s"] <= metrics["residual_ready_s"]


def test_a_wrong_draft_is_rolled_back_and_replaced_by_the_full_precision_token(world):
    req, frames = admit(world, "a", 1)
    req.output_ids += [1, 9, 3]
    world.predictions["a"] = [1, 2, 5]
    world.controller.before_schedule(Batch([req]))
    land_residual(world, 1, frames)
    world.controller.before_schedule(Batch([]))
    assert req.output_ids == [7, 1, 2]
    assert world.freed == [("a", PROMPT + 2)], "KV from the first discarded token on is freed"
    metrics = world.controller.metrics(req)
    assert (metrics["accepted_tokens"], metrics["rollbacks"]) == (1, 1)


def test_a_request_verified_up_to_its_length_limit_finishes_into_the_cache(world):
    req, frames = admit(world, "a", 1)
    req.sampling_params.max_new_tokens = 3
    req.output_ids += [1, 2]
    world.predictions["a"] = [1, 2]
    world.controller.before_schedule(Batch([req]))
    land_residual(world, 1, frames)
    world.controller.before_schedule(Batch([]))
    assert req.finished() and world.released == [("a", True)] and world.scheduler.streamed == [req]
    assert world.side.rooms.get(1) is None


def test_a_failed_residual_drops_the_drafts_answers_with_the_reason_and_frees_everything(world):
    req, _ = admit(world, "a", 1)
    req.output_ids += [1, 2]
    batch = Batch([req])
    world.side.on_prefill_failure(1, "prefill out of memory")
    world.controller.before_schedule(batch)
    assert req.output_ids == [7] and batch.reqs == []
    assert "residual KV failed: prefill out of memory" in req.finished_reason.message
    assert world.released == [("a", False)] and world.scheduler.streamed == [req]
    assert world.side.rooms.get(1) is None and "a" not in world.controller.reqs


def test_a_residual_that_stops_moving_fails_the_request_after_the_timeout(world):
    req, _ = admit(world, "a", 1)
    world.clock.now += 9
    world.controller.before_schedule(Batch([req]))
    assert not req.finished()
    world.clock.now += 2
    world.controller.before_schedule(Batch([req]))
    assert req.finished() and "made no progress for 10s" in req.finished_reason.message


def test_only_one_request_is_verified_per_pass(world):
    reqs = []
    for index, room in enumerate((1, 2)):
        req, frames = admit(world, f"r{index}", room)
        req.output_ids += [1]
        world.predictions[req.rid] = [1]
        land_residual(world, room, frames)
        reqs.append(req)
    world.controller.before_schedule(Batch(reqs))
    assert [state_of(r).anchor for r in reqs] == [False, True]
    world.controller.before_schedule(Batch(reqs[1:]))
    assert not state_of(reqs[1]).anchor
