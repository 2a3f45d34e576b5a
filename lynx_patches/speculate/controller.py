"""Anchor phase, verify and rollback for ``lynx``-mode requests on a decode server.

Runs on the scheduler thread, once per loop iteration before the next decode
batch is formed (`before_schedule`), so the KV it upgrades or rewrites is
never read by a forward pass in flight. Per iteration it:

1. fails requests whose residual failed or timed out: held-back tokens are
   dropped, the client gets the reason, every slot is freed;
2. verifies at most one request whose residual has landed (one verify pass
   per iteration, so other requests wait at most one pass): upgrade the
   prompt KV, recompute the held-back tokens, keep the agreeing prefix plus
   the full-precision correction, free the rest, and return the request to
   SGLang's queue;
3. parks requests that reached their speculative cap (or may not speculate)
   until their residual lands.
"""

from __future__ import annotations

import logging
import time
from http import HTTPStatus

import torch
from lynx.kvwire import WireFormat
from lynx.sampling import draw
from lynx.speculation import verify as verify_tokens
from lynx.transfer.rooms import RoomState

from lynx_patches.speculate.state import (
    ATTR,
    SpecState,
    can_speculate,
    coupled_rows,
    request_seed,
    sampling_rule,
    state_of,
)
from lynx_patches.speculate.verify import free_tail, verify_logits

logger = logging.getLogger(__name__)

IDLE_WAIT_S = 0.005


class SpecController:
    """One per decode scheduler in ``lynx`` mode."""

    def __init__(self, scheduler, side) -> None:
        self.scheduler = scheduler
        self.side = side
        self.config = side.config
        self.wire: WireFormat = side.wire
        self.reqs: dict[str, object] = {}
        self.parked: list = []
        self.prometheus = None
        if scheduler.metrics_reporter.enable_metrics:
            from lynx_patches.prometheus import LynxMetrics

            self.prometheus = LynxMetrics(self.config.mode)

    # --- adoption (transfer committed, scheduler thread) -------------------------------------

    def adopt(self, req, residual_pending: bool, timings: dict) -> SpecState:
        """Take over a request whose anchor has landed (a residual it lost fails it next tick).

        `timings` are the transfer's milestones so far; the room may be gone already.
        """
        params = req.sampling_params
        cap = self.config.max_speculative_tokens if can_speculate(params, req) else 0
        state = SpecState(
            room=req.bootstrap_room,
            verified=len(req.output_ids),
            cap=cap,
            rule=sampling_rule(params),
            seed=request_seed(params),
            timings=dict(timings),
        )
        state.anchor = residual_pending
        if state.anchor:
            # Partial-precision KV never enters the decode radix cache.
            state.barred_from_tree = req.skip_radix_cache_insert
            req.skip_radix_cache_insert = True
        setattr(req, ATTR, state)
        self.reqs[req.rid] = req
        return state

    @property
    def busy(self) -> bool:
        return bool(self.parked)

    @staticmethod
    def coupled_rows(batch) -> list[tuple]:
        """The batch's rows Lynx samples itself: its sampled requests, with their seeds."""

        def choose(req):
            state = state_of(req)
            return (state.rule, state.seed) if state is not None and state.rule is not None else None

        return coupled_rows(batch.reqs, choose)

    def metrics(self, req) -> dict:
        state = state_of(req)
        if state is None:
            return {"mode": self.config.mode}
        state.timings.update(self.side.rooms.timings(state.room))
        return {"mode": self.config.mode, **state.timings, **state.metrics()}

    # --- per iteration -------------------------------------------------------------------------

    def before_schedule(self, running_batch):
        verified_one = False
        for req in list(self.reqs.values()):
            state = state_of(req)
            if req.finished():
                self._drop(req)
                continue
            if not state.anchor:
                continue
            failure = self.side.check(state.room)
            room_state = self.side.rooms.state(state.room)
            if failure is not None or room_state is None:
                self._fail(req, f"residual KV failed: {failure or 'the transfer was lost'}", running_batch)
            elif room_state is RoomState.LANDED and not verified_one:
                self._verify(req, state, running_batch)
                verified_one = True
        self._park(running_batch)
        if running_batch.is_empty() and not self.scheduler.waiting_queue and self.parked:
            self.side.landed.wait(IDLE_WAIT_S)
            self.side.landed.clear()
        return running_batch

    # --- verify --------------------------------------------------------------------------------

    def _verify(self, req, state: SpecState, running_batch) -> None:
        started = time.perf_counter()
        if not self.side.apply_residual(state.room):
            return
        prompt = len(req.origin_input_ids)
        held_back = state.speculated(len(req.output_ids))
        state.anchor = False
        req.skip_radix_cache_insert = state.barred_from_tree
        if held_back == 0:
            if req in running_batch.reqs:
                from sglang.srt.mem_cache.common import checkpoint_kv_cache

                checkpoint_kv_cache(req, self.scheduler.tree_cache)
            self._resume(req, state)
        else:
            self._remove_from(running_batch, req)
            logits = verify_logits(self.scheduler, req, len(req.output_ids) - 1)
            predicted = self._predict(logits, state)[state.verified - 1 :]
            verdict = verify_tokens(req.output_ids[state.verified - 1 :], predicted)
            kept = list(req.output_ids[: state.verified - 1]) + list(verdict.output_ids)
            free_tail(self.scheduler, req, prompt + len(kept) - 1)
            del req.output_ids[len(kept) - 1 :]
            req.output_ids.append(kept[-1])
            state.speculative_tokens += verdict.speculative
            state.accepted_tokens += verdict.accepted
            state.rollbacks += int(verdict.rolled_back)
            state.verify_s = time.perf_counter() - started
            newly = len(req.output_ids) - state.verified
            state.verified = len(req.output_ids)
            self._attach_metrics(req)
            req.update_finish_state(new_accepted_len=newly)
            if req.finished():
                self._finish(req, checkpoint=True)
            else:
                self._resume(req, state, requeue=True)
        state.verify_s = time.perf_counter() - started
        self._attach_metrics(req)

    @staticmethod
    def _predict(logits: torch.Tensor, state: SpecState) -> list[int]:
        """The token full-precision decoding draws after each row (row i -> output index i + 1)."""
        if state.rule is None:
            return torch.argmax(logits, dim=-1).tolist()
        return [draw(row, state.rule, state.seed, i + 1) for i, row in enumerate(logits)]

    def _resume(self, req, state: SpecState, requeue: bool = False) -> None:
        if state.parked or requeue:
            state.parked = False
            if req in self.parked:
                self.parked.remove(req)
            self.scheduler.waiting_queue.append(req)

    # --- parking, failing, finishing --------------------------------------------------------

    def _park(self, running_batch) -> None:
        waiting = self.scheduler.waiting_queue
        for req in list(waiting):
            state = state_of(req)
            if state is not None and state.anchor and state.cap == 0:
                waiting.remove(req)
                self._hold(req, state)
        capped = [
            req
            for req in running_batch.reqs
            if (state := state_of(req)) is not None
            and state.anchor
            and state.speculated(len(req.output_ids)) >= self._cap(req, state)
        ]
        for req in capped:
            self._remove_from(running_batch, req)
            self._hold(req, state_of(req))

    def _cap(self, req, state: SpecState) -> int:
        room_left = req.sampling_params.max_new_tokens - state.verified
        return max(0, min(state.cap, room_left))

    def _hold(self, req, state: SpecState) -> None:
        state.parked = True
        self.parked.append(req)

    @staticmethod
    def _remove_from(batch, req) -> None:
        if req in batch.reqs:
            batch.filter_batch(keep_indices=[i for i, r in enumerate(batch.reqs) if r is not req])

    def _fail(self, req, reason: str, running_batch=None) -> None:
        """Drop held-back tokens, answer the client with `reason`, free every slot."""
        from sglang.srt.managers.schedule_batch import FINISH_ABORT

        logger.error("Lynx decode: request %s failed: %s", req.rid, reason)
        state = state_of(req)
        if running_batch is not None:
            self._remove_from(running_batch, req)
        if req in self.scheduler.waiting_queue:
            self.scheduler.waiting_queue.remove(req)
        if req in self.parked:
            self.parked.remove(req)
        del req.output_ids[state.verified :]
        state.anchor = False
        req.finished_reason = FINISH_ABORT(reason, HTTPStatus.INTERNAL_SERVER_ERROR)
        self._finish(req, checkpoint=False)

    def _finish(self, req, checkpoint: bool) -> None:
        """Release a finished request's KV (into the radix cache if `checkpoint`) and answer it."""
        from sglang.srt.mem_cache.common import release_kv_cache

        release_kv_cache(req, self.scheduler.tree_cache, checkpoint=checkpoint)
        self.scheduler.output_streamer.stream_output([req], req.return_logprob)
        self._drop(req)

    def _drop(self, req) -> None:
        if self.reqs.pop(req.rid, None) is not None and self.prometheus is not None:
            self.prometheus.record(self.metrics(req))
        if req in self.parked:
            self.parked.remove(req)
        self.side.forget(state_of(req).room)

    def _attach_metrics(self, req) -> None:
        from lynx_patches.metrics import attach

        attach(req, self.metrics(req))
