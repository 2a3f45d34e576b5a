"""`SpecController` against a fake scheduler, a real `DecodeSide` on a fake pool, and a scripted verify pass.

The verify forward (an SGLang model pass) is replaced by logits that predict
chosen tokens, the sampler by their argmax, and KV release by a recorder;
everything else (the room table, holding, parking, rollback and replay, the
finish hook, failure) is the real code. The controller sees the side only
through `DecodeSideView`: any other member it reached for would fail the test.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from sglang.srt.constrained.base_grammar_backend import BaseGrammarObject
from lynx.request_lifecycle import Phase
from lynx.transfer.keys import transfer_key
from pd_fakes import SECRET, DecodeHost, FakePool, LockstepGroup, config, run_ranks, transfer_messages

from lynx.pd.consumer import DecodeSideView
from lynx.pd.decode_side import DecodeSide
from lynx_patches.speculate import commit, verify_pass
from lynx_patches.speculate import controller as controller_module
from lynx_patches.speculate import hooks
from lynx_patches.speculate.controller import SpecController
from lynx_patches.speculate.predict import Choice
from lynx_patches.speculate.state import state_of

VOCAB = 50
PROMPT = 20
EOS = 0


@dataclass(eq=False)
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
    custom_logit_processor: object = None

    def __post_init__(self):
        self.sampling_params = SimpleNamespace(
            max_new_tokens=self.max_new_tokens, temperature=0.0, top_k=1, top_p=1.0, min_p=0.0, sampling_seed=None, n=1
        )

    def finished(self):
        return self.finished_reason is not None

    def update_finish_state(self, new_accepted_len=1):
        """SGLang's method (length, EOS, pending abort) behind Lynx's finish hook, as a server runs it."""

        def original(req, *args, **kwargs):
            if req.finished():
                return
            if req.to_finish:
                req.finished_reason, req.to_finish = req.to_finish, None
            elif req.output_ids[-1] == EOS:
                req.finished_reason = "stop"
            elif len(req.output_ids) >= req.sampling_params.max_new_tokens:
                req.finished_reason = "length"

        hooks.update_finish_state(original, self, new_accepted_len)


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
        self.model_config = SimpleNamespace(vocab_size=VOCAB)
        self.streamed = []
        self.output_streamer = SimpleNamespace(stream_output=lambda reqs, _: self.streamed.extend(reqs))

    def is_fully_idle(self):
        return False


def _verify_logits(sched, spans):
    world = sched.world
    world.passes.append([(span.req.rid, span.start, span.count) for span in spans])
    rows = [world.predictions[s.req.rid][s.start : s.start + s.count] for s in spans]
    tokens = torch.tensor([t for row in rows for t in row])
    logits = torch.full((len(tokens), VOCAB), -10.0)
    logits[torch.arange(len(tokens)), tokens] = 10.0
    return logits


def _predict(sched, spans, logits):
    tokens = logits.argmax(-1).tolist()
    out, start = [], 0
    for span in spans:
        out.append([Choice(t) for t in tokens[start : start + span.count]])
        start += span.count
    return out


VIEW = {name for name in vars(DecodeSideView) if not name.startswith("_")} | set(DecodeSideView.__annotations__)


class ViewOnly:
    """A decode side of which only the members of `DecodeSideView` can be read or written."""

    def __init__(self, side):
        object.__setattr__(self, "_side", side)

    def __getattr__(self, name):
        if name not in VIEW:
            raise AttributeError(f"{name} is not part of DecodeSideView")
        return getattr(self._side, name)

    def __setattr__(self, name, value):
        if name not in VIEW:
            raise AttributeError(f"{name} is not part of DecodeSideView")
        setattr(self._side, name, value)


def make_world(agreement=None):
    """A controller on a real decode side (one decode rank); `released` records KV releases,
    `freed` tail frees, `checkpointed` radix-cache checkpoints, `passes` verify passes."""
    clock = SimpleNamespace(now=0.0)
    host = DecodeHost()
    side = DecodeSide(config(max_speculative_tokens=3, transfer_timeout=10.0), SECRET, host, "127.0.0.1", clock=lambda: clock.now)
    pool = FakePool(seed=1)  # kept alive in the world: the view holds raw addresses of its metadata rows
    side.attach(pool.view)
    scheduler = Scheduler()
    world = SimpleNamespace(
        pool=pool, side=side, host=host, scheduler=scheduler, controller=SpecController(scheduler, ViewOnly(side), agreement),
        clock=clock,
        released=[], freed=[], passes=[], predictions={}, checkpointed=[],
    )  # fmt: skip
    scheduler.world = world
    scheduler.tree_cache = SimpleNamespace(released=world.released, checkpointed=world.checkpointed)
    return world


@pytest.fixture
def patched(monkeypatch):
    """SGLang's KV release, radix cache and the verify forward replaced by recorders of each rank's world."""
    monkeypatch.setattr(
        "sglang.srt.mem_cache.common.release_kv_cache",
        lambda req, tree, checkpoint: tree.released.append((req.rid, checkpoint)),
    )
    monkeypatch.setattr(
        "sglang.srt.mem_cache.common.checkpoint_kv_cache", lambda req, tree: tree.checkpointed.append(req.rid)
    )
    monkeypatch.setattr(commit, "free_tail", lambda sched, req, keep: sched.world.freed.append((req.rid, keep)))
    monkeypatch.setattr(verify_pass, "verify_logits", _verify_logits)
    monkeypatch.setattr(verify_pass, "predict", _predict)


@pytest.fixture
def world(patched):
    world = make_world()
    yield world
    world.side.close()


def admit(world, rid, room, first_token=7, first_iteration_over=True, **req_args):
    """A request whose anchor landed: its room anchored on the side, adopted by the controller
    (and, if `first_iteration_over`, its adoption iteration over)."""
    side = world.side
    assert side.claim(room)
    nonce = side.reserve(room, np.arange(PROMPT), 0, 0.0, "prefill", ())
    key = transfer_key(SECRET, nonce)
    manifest, frames = transfer_messages(side.config, FakePool(seed=0), range(PROMPT), room, key, bytes(24))
    for parts in [manifest.seal(key), *frames[255], *frames[0]]:
        side._on_message(parts)
    side.hand_over(room)
    req = Req(rid, room, [first_token], **req_args)
    world.controller.adopt(req, residual_pending=True, timings=side.timings(room))
    if first_iteration_over:
        world.controller.after_schedule(Batch([]))  # the iteration that streams its first token
    return req, frames


def land_residual(world, frames):
    for parts in frames[1]:
        world.side._on_message(parts)


def test_a_residual_that_landed_with_the_anchor_is_applied_after_the_first_token_not_before(world):
    side = world.side
    assert side.claim(9)
    nonce = side.reserve(9, np.arange(PROMPT), 0, 0.0, "prefill", ())
    key = transfer_key(SECRET, nonce)
    manifest, frames = transfer_messages(side.config, FakePool(seed=0), range(PROMPT), 9, key, bytes(24))
    for parts in [manifest.seal(key), *frames[255], *frames[0], *frames[1]]:
        side._on_message(parts)
    side.hand_over(9)
    req = Req("f", 9, [7])
    world.controller.adopt(req, residual_pending=True, timings=side.timings(9))
    batch = Batch([])
    world.controller.before_schedule(batch)  # the first token is streamed after this: no upgrade yet
    assert state_of(req).phase is Phase.FRESH and "upgrade_s" not in state_of(req).profile
    batch.reqs.append(req)  # SGLang's prebuilt step streamed the first token and merged the request
    world.controller.after_schedule(batch)
    assert state_of(req).phase is Phase.EXACT and state_of(req).profile["upgrade_s"] > 0
    assert world.passes == [], "nothing was drafted: no verify pass"
    assert world.checkpointed == ["f"], "its full-precision prompt KV may enter the radix cache now"


def test_a_request_that_drafted_its_cap_is_parked_until_its_residual_lands(world):
    req, _ = admit(world, "a", 1)
    batch = Batch([req])
    req.output_ids += [1, 2]
    world.controller.before_schedule(batch)
    assert batch.reqs == [req] and not world.controller.busy
    req.output_ids += [3]
    world.controller.before_schedule(batch)
    assert batch.reqs == [] and world.controller.parked == [req] and state_of(req).phase is Phase.PARKED


def test_drafts_that_full_precision_agrees_with_are_all_kept_verified_and_requeued(world):
    req, frames = admit(world, "a", 1)
    req.output_ids += [1, 2, 3]
    world.predictions["a"] = [1, 2, 3]
    batch = Batch([req])
    world.controller.before_schedule(batch)  # parks at the cap
    land_residual(world, frames)
    world.controller.before_schedule(batch)
    assert req.output_ids == [7, 1, 2, 3] and state_of(req).verified == 4 and state_of(req).phase is Phase.REQUEUED
    assert world.passes == [[("a", 0, 3)]], "rows: t0 and the first two drafts"
    assert world.scheduler.waiting_queue == [req] and world.controller.parked == []
    metrics = world.controller.metrics(req)
    assert (metrics["speculative_tokens"], metrics["accepted_tokens"], metrics["rollbacks"]) == (3, 3, 0)
    assert metrics["anchor_ready_s"] <= metrics["residual_ready_s"]
    assert {"upgrade_s", "forward_s", "predict_s", "commit_s", "verify_s"} <= metrics.keys()


def test_a_wrong_draft_is_rolled_back_and_replaced_by_the_full_precision_token(world):
    req, frames = admit(world, "a", 1)
    req.output_ids += [1, 9, 3]
    world.predictions["a"] = [1, 2, 5]
    batch = Batch([req])
    world.controller.before_schedule(batch)
    land_residual(world, frames)
    world.controller.before_schedule(batch)
    assert req.output_ids == [7, 1, 2]
    assert world.freed == [("a", PROMPT + 2)], "KV from the first discarded token on is freed"
    metrics = world.controller.metrics(req)
    assert (metrics["accepted_tokens"], metrics["rollbacks"]) == (1, 1)


def test_a_request_verified_up_to_its_length_limit_finishes_into_the_cache(world):
    req, frames = admit(world, "a", 1, max_new_tokens=3)
    req.output_ids += [1, 2]
    world.predictions["a"] = [1, 2]
    world.controller.before_schedule(Batch([req]))
    land_residual(world, frames)
    world.controller.before_schedule(Batch([]))
    assert req.finished() and world.released == [("a", True)] and world.scheduler.streamed == [req]
    assert world.side.room_state(1) is None


def test_an_eos_among_the_accepted_drafts_finishes_the_request_there(world):
    req, frames = admit(world, "a", 1)
    req.output_ids += [1, EOS, 3]
    world.predictions["a"] = [1, EOS, 3]
    world.controller.before_schedule(Batch([req]))
    land_residual(world, frames)
    world.controller.before_schedule(Batch([]))
    assert req.output_ids == [7, 1, EOS] and req.finished_reason == "stop"
    assert world.released == [("a", True)] and world.scheduler.waiting_queue == []


def test_every_landed_request_is_verified_in_one_pass(world):
    reqs = []
    for index, room in enumerate((1, 2, 3)):
        req, frames = admit(world, f"r{index}", room)
        req.output_ids += [1, 2][: index + 1]
        world.predictions[req.rid] = [1, 2]
        land_residual(world, frames)
        reqs.append(req)
    batch = Batch(reqs)
    world.controller.before_schedule(batch)
    assert world.passes == [[("r0", 0, 1), ("r1", 0, 2), ("r2", 0, 2)]]
    assert all(state_of(r).phase is Phase.REQUEUED and state_of(r).verify_batch == 3 for r in reqs)
    assert batch.reqs == [] and world.scheduler.waiting_queue == reqs


def test_a_request_that_may_not_speculate_streams_its_first_token_then_waits(world):
    req, frames = admit(world, "a", 1, custom_logit_processor="processor")
    world.scheduler.waiting_queue.append(req)
    world.controller.before_schedule(Batch([]))
    assert world.scheduler.streamed == [req] and world.scheduler.waiting_queue == [] and state_of(req).phase is Phase.PARKED
    land_residual(world, frames)
    world.controller.before_schedule(Batch([]))
    assert world.passes == [] and world.scheduler.waiting_queue == [req] and state_of(req).phase is Phase.EXACT


@pytest.mark.parametrize("landed_with_the_anchor", [True, False])
def test_a_request_that_may_not_speculate_is_held_in_its_first_iteration_and_upgraded_after_it(world, landed_with_the_anchor):
    req, frames = admit(world, "a", 1, first_iteration_over=False, custom_logit_processor="processor")
    if landed_with_the_anchor:
        land_residual(world, frames)
    world.scheduler.waiting_queue.append(req)  # SGLang's transfer queue hands it over in the iteration it adopts it
    world.controller.before_schedule(Batch([]))
    assert state_of(req).phase is Phase.FRESH_PARKED and "upgrade_s" not in state_of(req).profile
    assert world.controller.parked == [req] and world.controller.busy and world.scheduler.streamed == [req]
    world.controller.after_schedule(Batch([]))  # its first look at the residual
    if not landed_with_the_anchor:
        assert state_of(req).phase is Phase.PARKED and world.scheduler.waiting_queue == []
        land_residual(world, frames)
        world.controller.before_schedule(Batch([]))
    assert state_of(req).phase is Phase.EXACT and world.scheduler.waiting_queue == [req]
    assert world.controller.parked == [] and world.passes == []


def test_a_request_that_may_not_speculate_and_ends_at_its_first_token_is_left_to_sglang(world):
    req, _ = admit(world, "a", 1, first_token=EOS, custom_logit_processor="processor")
    world.scheduler.waiting_queue.append(req)
    world.controller.before_schedule(Batch([]))
    assert req.finished() and world.scheduler.waiting_queue == [req] and world.scheduler.streamed == []


def test_an_abort_of_a_parked_request_ends_it_without_its_drafts(world):
    req, _ = admit(world, "a", 1)
    req.output_ids += [1, 2, 3]
    world.controller.before_schedule(Batch([req]))
    setattr(world.scheduler, hooks.CONTROLLER_ATTR, world.controller)
    assert hooks.inflight_reqs({"other"}, world.scheduler) == {"other", req}, "SGLang's abort reaches it"
    req.to_finish = "abort"
    world.controller.before_schedule(Batch([]))
    assert req.finished_reason == "abort" and req.output_ids == [7]
    assert world.released == [("a", False)] and world.controller.parked == []


def test_a_failed_residual_drops_the_drafts_answers_with_the_reason_and_frees_everything(world):
    req, _ = admit(world, "a", 1)
    req.output_ids += [1, 2]
    batch = Batch([req])
    world.side.on_prefill_failure(1, "prefill out of memory")
    world.controller.before_schedule(batch)
    assert req.output_ids == [7] and batch.reqs == []
    assert "residual KV failed: prefill out of memory" in req.finished_reason.message
    assert world.released == [("a", False)] and world.scheduler.streamed == [req]
    assert world.side.room_state(1) is None and "a" not in world.controller.reqs


def test_a_residual_that_stops_moving_fails_the_request_after_the_timeout(world):
    req, _ = admit(world, "a", 1)
    world.clock.now += 9
    world.controller.before_schedule(Batch([req]))
    assert not req.finished()
    world.clock.now += 2
    world.controller.before_schedule(Batch([req]))
    assert req.finished() and "made no progress for 10s" in req.finished_reason.message


class _Grammar(BaseGrammarObject):
    def __init__(self):
        super().__init__()
        self.accepted, self.rolled_back = [], []

    def accept_token(self, token):
        self.accepted.append(token)

    def rollback(self, k):
        self.rolled_back.append(k)
        del self.accepted[-k:]

    def is_terminated(self):
        return False


def test_a_grammar_is_rolled_back_over_the_drafts_and_advanced_over_the_verified_tokens(world):
    grammar = _Grammar()
    req, frames = admit(world, "a", 1, grammar=grammar)
    grammar.accepted = [7, 1, 9, 3]  # t0 and the drafts, as SGLang's decode steps accepted them
    req.output_ids += [1, 9, 3]
    world.predictions["a"] = [1, 2, 5]
    world.controller.before_schedule(Batch([req]))
    land_residual(world, frames)
    world.controller.before_schedule(Batch([]))
    assert grammar.rolled_back == [3] and grammar.accepted == [7, 1, 2] and req.output_ids == [7, 1, 2]


class _Ending(_Grammar):
    """Terminates once it has accepted `ends_after` tokens (it accepts again when rolled back)."""

    def __init__(self, ends_after):
        super().__init__()
        self.ends_after = ends_after

    def accept_token(self, token):
        assert not self.is_terminated(), "a terminated grammar accepts no token"
        super().accept_token(token)

    def is_terminated(self):
        return len(self.accepted) >= self.ends_after


def test_a_grammar_that_terminated_among_the_drafts_is_rolled_back_over_the_drafts_it_accepted(world):
    grammar = _Ending(ends_after=3)
    req, frames = admit(world, "a", 1, grammar=grammar)
    grammar.accepted = [7]  # t0, as the prefill's step accepted it
    batch = Batch([req])
    for token in (1, 9, 3):  # SGLang's decode steps: 9 ends the grammar, which then takes no token
        req.output_ids.append(token)
        if not grammar.is_terminated():
            grammar.accept_token(token)
        world.controller.before_schedule(batch)
    assert state_of(req).phase is Phase.PARKED and state_of(req).grammar_end == 3
    world.predictions["a"] = [1, 9, 3]
    land_residual(world, frames)
    world.controller.before_schedule(batch)
    assert grammar.rolled_back == [2] and grammar.accepted == [7, 1, 9] and req.output_ids == [7, 1, 9, 3]


def test_a_requeued_request_gets_its_penalizer_history_back(world, monkeypatch):
    seen = []
    monkeypatch.setattr(controller_module, "penalizer_rows", lambda vocab, batch, histories: seen.append(histories) or "rows")
    req, frames = admit(world, "a", 1)
    req.output_ids += [1, 2]
    world.predictions["a"] = [1, 2]
    land_residual(world, frames)
    world.controller.before_schedule(Batch([req]))
    fresh = Req("b", 2, [5])
    prebuilt = SimpleNamespace(reqs=[fresh, req], sampling_info=SimpleNamespace(
        penalizer_orchestrator=SimpleNamespace(is_required=True)))  # fmt: skip
    world.controller.after_prebuilt(prebuilt)
    assert seen == [[[], [7, 1]]] and prebuilt.sampling_info.penalizer_orchestrator == "rows"
    assert state_of(req).phase is Phase.EXACT


def test_a_verify_pass_that_fails_ends_its_requests_with_the_cause_and_the_server_goes_on(world, monkeypatch):
    def broken(sched, spans):
        raise RuntimeError("out of memory")

    monkeypatch.setattr(verify_pass, "verify_logits", broken)
    req, frames = admit(world, "a", 1)
    req.output_ids += [1, 2]
    land_residual(world, frames)
    world.controller.before_schedule(Batch([req]))
    assert "verify pass failed" in req.finished_reason.message and req.output_ids == [7]
    assert world.released == [("a", False)] and world.controller.reqs == {}


def test_a_grammar_that_cannot_roll_back_keeps_its_request_from_speculating(world):
    req, _ = admit(world, "a", 1, grammar=BaseGrammarObject())
    assert state_of(req).cap == 0
    world.scheduler.waiting_queue.append(req)
    world.controller.before_schedule(Batch([]))
    assert state_of(req).phase is Phase.PARKED and world.scheduler.streamed == [req]


def test_a_request_already_finished_when_its_transfer_commits_leaves_no_room_behind(world):
    from lynx_patches.pd.conn import LynxKVReceiver

    class Receiver(LynxKVReceiver):
        def __init__(self, side):
            self.lynx_side = side

    side = world.side
    assert side.claim(5)
    nonce = side.reserve(5, np.arange(PROMPT), 0, 0.0, "prefill", ("tcp://prefill:1",))
    key = transfer_key(SECRET, nonce)
    manifest, frames = transfer_messages(side.config, FakePool(seed=0), range(PROMPT), 5, key, bytes(24))
    for parts in [manifest.seal(key), *frames[255], *frames[0]]:
        side._on_message(parts)
    setattr(world.scheduler, hooks.CONTROLLER_ATTR, world.controller)
    req = Req("gone", 5, [7], finished_reason="abort")
    committed = []
    queue = SimpleNamespace(scheduler=world.scheduler)
    decode_req = SimpleNamespace(req=req, kv_receiver=Receiver(side))
    hooks.commit_transfer(lambda q, d: committed.append(d.req), queue, decode_req)
    side.release(5)  # SGLang's receiver is cleared next
    assert committed == [req] and "gone" not in world.controller.reqs
    assert side.room_state(5) is None and side.live_count() == 0
    assert world.host.cancelled == [5], "the prefill is asked to stop sending the residual"


@pytest.fixture
def two_ranks(patched):
    """The two decode ranks of a TP 2 server: a world each, agreeing over a lockstep group."""
    group = LockstepGroup(2)
    worlds = [make_world(group.agreement(rank)) for rank in range(2)]
    yield worlds
    for world in worlds:
        world.side.close()


def test_a_request_is_verified_only_once_every_decode_rank_has_applied_its_residual(two_ranks):
    admitted = run_ranks(two_ranks, lambda w: admit(w, "a", 1))
    for (req, _), world in zip(admitted, two_ranks):
        req.output_ids += [1, 2, 3]
        world.predictions["a"] = [1, 2, 3]
    batches = [Batch([req]) for req, _ in admitted]
    run_ranks(two_ranks, lambda w: w.controller.before_schedule(batches[two_ranks.index(w)]))  # both park
    land_residual(two_ranks[0], admitted[0][1])
    run_ranks(two_ranks, lambda w: w.controller.before_schedule(batches[two_ranks.index(w)]))
    assert [w.passes for w in two_ranks] == [[], []], "rank 1 still waits for its residual: nobody verifies"
    assert [state_of(req).phase for req, _ in admitted] == [Phase.PARKED] * 2
    assert [w.controller.waiting_on_peers for w in two_ranks] == [True, False]
    land_residual(two_ranks[1], admitted[1][1])
    run_ranks(two_ranks, lambda w: w.controller.before_schedule(batches[two_ranks.index(w)]))
    assert [w.passes for w in two_ranks] == [[[("a", 0, 3)]]] * 2, "one pass, on both ranks, in the same iteration"
    assert [req.output_ids for req, _ in admitted] == [[7, 1, 2, 3]] * 2
    assert [w.controller.waiting_on_peers for w in two_ranks] == [False, False]


def test_a_residual_that_failed_on_one_decode_rank_fails_the_request_on_every_rank(two_ranks):
    admitted = run_ranks(two_ranks, lambda w: admit(w, "a", 1))
    for req, _ in admitted:
        req.output_ids += [1, 2]
    land_residual(two_ranks[0], admitted[0][1])
    two_ranks[1].side.on_prefill_failure(1, "prefill out of memory")
    batches = [Batch([req]) for req, _ in admitted]
    run_ranks(two_ranks, lambda w: w.controller.before_schedule(batches[two_ranks.index(w)]))
    messages = [req.finished_reason.message for req, _ in admitted]
    assert messages[1] == "residual KV failed: prefill out of memory"
    assert messages[0] == "residual KV failed: prefill out of memory (on another decode rank)"
    assert [req.output_ids for req, _ in admitted] == [[7], [7]] and [w.passes for w in two_ranks] == [[], []]
    assert [w.released for w in two_ranks] == [[("a", False)]] * 2
    assert all(w.side.room_state(1) is None and not w.controller.reqs for w in two_ranks)


def test_unseeded_sampled_requests_draw_the_same_noise_on_every_decode_rank(two_ranks):
    def sampled(world):
        req, _ = admit(world, "s", 3)
        return state_of(req).seed

    assert len(set(run_ranks(two_ranks, sampled))) == 1


def test_one_iteration_moves_each_request_by_its_own_phase(world):
    aborted, _ = admit(world, "aborted", 1)
    aborted.output_ids += [1, 2, 3]
    world.controller.before_schedule(Batch([aborted]))  # parked at its cap
    aborted.to_finish = "abort"
    done, _ = admit(world, "done", 2)
    done.finished_reason = "stop"  # SGLang finished it in the last step
    landed, frames = admit(world, "landed", 3)
    landed.output_ids += [1, 2]
    world.predictions["landed"] = [1, 2]
    land_residual(world, frames)
    failed, _ = admit(world, "failed", 4)
    failed.output_ids += [1]
    world.side.on_prefill_failure(4, "prefill out of memory")
    pending, _ = admit(world, "pending", 5)
    pending.output_ids += [1]
    capped, _ = admit(world, "capped", 6)
    capped.output_ids += [1, 2, 3]
    held, _ = admit(world, "held", 7, first_iteration_over=False, custom_logit_processor="processor")
    world.scheduler.waiting_queue.append(held)
    batch = Batch([landed, failed, pending, capped])
    world.controller.before_schedule(batch)
    reqs = (aborted, done, landed, failed, pending, capped, held)
    assert {r.rid: state_of(r).phase for r in reqs} == {
        "aborted": Phase.PARKED,  # finished in the phase it was in
        "done": Phase.DRAFTING,
        "landed": Phase.REQUEUED,
        "failed": Phase.FAILED,
        "pending": Phase.DRAFTING,
        "capped": Phase.PARKED,
        "held": Phase.FRESH_PARKED,
    }
    assert set(world.controller.reqs) == {"landed", "pending", "capped", "held"}
    assert batch.reqs == [pending] and world.scheduler.waiting_queue == [landed]
    assert world.passes == [[("landed", 0, 2)]]
    assert world.released == [("aborted", False), ("failed", False)]
    assert world.scheduler.streamed == [aborted, failed, held]


def test_the_controller_reaches_the_decode_side_only_through_the_view(world):
    assert world.controller.side.landed is world.side.landed
    with pytest.raises(AttributeError, match="claim is not part of DecodeSideView"):
        world.controller.side.claim(1)
