"""The decode request's lifecycle on a decode server, one pass over its requests per hook, by phase.

Phases and moves are `lynx.request_lifecycle`'s; everything runs on the
scheduler thread. Per iteration:

* `before_schedule`, before the next decode batch is formed (so the KV it
  upgrades or rewrites is never read by a forward pass in flight): finished
  requests are dropped and aborted ``PARKED`` ones ended; the residuals of
  ``DRAFTING`` and ``PARKED`` requests are polled on every decode rank
  (`residuals`). A failed one moves to ``FAILED``: its held-back tokens are
  dropped, the client gets the reason, every slot is freed. A landed one
  leaves the anchor (`_land`): ``EXACT`` at once if it drafted nothing, else
  ``VERIFYING``, all of those in one verify pass (`verify_pass`: the
  forward over every held-back token, each position's token as
  step-by-step decoding picks it, the agreeing prefix plus the correction
  replayed through SGLang's finish rules), and then ``REQUEUED`` in SGLang's
  queue, ``EXACT`` if its tokens finished it, or ``FAILED`` with the pass.
  Last, requests that may not speculate stream their first token (computed
  by the prefill on full KV) and are held, and requests that drafted their
  cap are parked (``FRESH_PARKED``, ``PARKED``) until their residual lands.
* `after_schedule`, once the batch streamed the first token of the requests
  adopted in this iteration: those settle (``DRAFTING``, ``PARKED``), and
  the ones that drafted nothing apply what has landed of their residual and
  leave the anchor if it is all in.
* `after_prebuilt`: a ``REQUEUED`` request gets its penalizer history in the
  batch that takes it up, and is ``EXACT``.
"""

from __future__ import annotations

import logging
import time
from http import HTTPStatus

from lynx.pd.consumer import DecodeSideView
from lynx.request_lifecycle import Phase, park_target, settle_target
from lynx.speculation import DraftWindow

from lynx_patches.metrics import attach
from lynx_patches.prometheus import LynxMetrics
from lynx_patches.speculate import commit, verify_pass
from lynx_patches.speculate.agree import RankAgreement
from lynx_patches.speculate.idle import IdleWait
from lynx_patches.speculate.predict import penalizer_rows
from lynx_patches.speculate.residuals import ResidualPoll
from lynx_patches.speculate.state import ATTR, SpecState, adopted_state, coupled_rows, state_of

logger = logging.getLogger(__name__)


class SpecController:
    """One per decode scheduler of a Lynx server (all modes; ``lynx`` and ``auto`` requests sent in two
    streams speculate)."""

    def __init__(self, scheduler, side: DecodeSideView, agreement: RankAgreement | None = None) -> None:
        self.scheduler = scheduler
        self.side = side
        self.config = side.config
        self.residuals = ResidualPoll(side, agreement or RankAgreement.of(scheduler))
        self.reqs: dict[str, object] = {}
        # A residual applied here that another decode rank still waits for: this rank's idle
        # wait must not sleep (the others pace the loop; it waits in their next collective).
        self.waiting_on_peers = False
        self.idle = IdleWait(scheduler, side.landed, parked=lambda: self.busy, ready=lambda: self.waiting_on_peers)
        self.window = DraftWindow(self.config.max_speculative_tokens if self.config.speculates else 0)
        self.prometheus = LynxMetrics(self.config.mode) if scheduler.metrics_reporter.enable_metrics else None

    # --- adoption (transfer committed, scheduler thread) -------------------------------------

    def adopt(self, req, residual_pending: bool, timings: dict) -> SpecState:
        """Take over a request whose anchor has landed (a residual it lost fails it next tick).

        `timings` are the transfer's milestones so far; the room may be gone already.
        """
        state = adopted_state(req, residual_pending, timings, self.config.max_speculative_tokens)
        if state.phase.on_anchor:
            # Partial-precision KV never enters the decode radix cache.
            state.barred_from_tree = req.skip_radix_cache_insert
            req.skip_radix_cache_insert = True
        setattr(req, ATTR, state)
        self.reqs[req.rid] = req
        return state

    @property
    def parked(self) -> list:
        """Requests held outside SGLang's queues until their residual lands."""
        return [req for req in self.reqs.values() if state_of(req).phase.parked]

    @property
    def busy(self) -> bool:
        return any(state_of(req).phase.parked for req in self.reqs.values())

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
        state.timings.update(self.side.timings(state.room))
        return {"mode": self.config.mode, **state.timings, **state.metrics()}

    # --- per iteration: one pass over the requests, by phase -------------------------------------

    def before_schedule(self, running_batch):
        """Before SGLang forms the next batch: end finished and aborted requests, poll the residuals of
        those drafting or parked, fail or land them, then hold and park (the module docstring)."""
        self.side.landed.clear()  # every landing after this is seen now or wakes the next idle wait
        self.window.tick(time.monotonic(), running=bool(getattr(running_batch, "reqs", None)))
        self.side.draft_window_s = self.window.seconds
        awaited = []
        for req in list(self.reqs.values()):
            state = state_of(req)
            if req.finished():
                self._drop(req)
            elif state.phase is Phase.PARKED and req.to_finish:
                self._finish(req, checkpoint=False)  # aborted while it waited
            elif state.phase.awaits_residual:
                state.watch_grammar(req.grammar, len(req.output_ids))
                awaited.append(req)
        polled = self.residuals.poll(awaited)
        self.waiting_on_peers = polled.waiting_on_peers
        for (req, _), reason in zip(polled.failed, self.residuals.reasons(polled.failed), strict=True):
            self._fail(req, f"residual KV failed: {reason}", running_batch)
        self._land(polled.ready, running_batch)
        self._hold_new()
        self._park(running_batch)
        return running_batch

    def after_schedule(self, running_batch) -> None:
        """Requests adopted this iteration have streamed their first token: apply what has landed
        of their residual now, before the forward (not before the first token, whose time it is)."""
        fresh = []
        for req in list(self.reqs.values()):
            state = state_of(req)
            if state.phase.fresh:
                state.move(settle_target(state.phase))
                if not req.finished() and not state.speculated(len(req.output_ids)):
                    fresh.append(req)
        polled = self.residuals.poll(fresh)  # a failure is left to the next `before_schedule`
        self.waiting_on_peers |= polled.waiting_on_peers
        self._land(polled.ready, running_batch)

    def after_prebuilt(self, batch) -> None:
        """A prebuilt batch has fresh penalizer rows: give verified requests their history back."""
        requeued = [req for req in batch.reqs if (state := state_of(req)) is not None and state.phase is Phase.REQUEUED]
        if not requeued or not batch.sampling_info.penalizer_orchestrator.is_required:
            return
        histories = [req.output_ids[:-1] if req in requeued else [] for req in batch.reqs]
        vocab = self.scheduler.model_config.vocab_size
        batch.sampling_info.penalizer_orchestrator = penalizer_rows(vocab, batch, histories)
        for req in requeued:
            state_of(req).move(Phase.EXACT)

    # --- leaving the anchor: exact at once, or through one verify pass ---------------------------

    def _land(self, landed: list, running_batch) -> None:
        """Requests whose residual every rank has applied: those without drafts are exact now, the
        rest are verified together in one pass."""
        drafted = []
        for req in landed:
            state = state_of(req)
            req.skip_radix_cache_insert = state.barred_from_tree
            if state.speculated(len(req.output_ids)):
                state.move(Phase.VERIFYING)
                drafted.append(req)
                continue
            if state.phase is Phase.PARKED:
                self.scheduler.waiting_queue.append(req)  # back into SGLang's queues, exact
            if req in running_batch.reqs:
                from sglang.srt.mem_cache.common import checkpoint_kv_cache

                checkpoint_kv_cache(req, self.scheduler.tree_cache)
            state.move(Phase.EXACT)
            attach(req, self.metrics(req))
        if drafted:
            self._verify(drafted, running_batch)

    def _verify(self, reqs: list, running_batch) -> None:
        """One pass over `reqs` (VERIFYING): each ends EXACT and finished, REQUEUED, or FAILED with the pass."""
        self._remove_from(running_batch, reqs)
        spans = [verify_pass.open_span(req) for req in reqs]
        try:
            choices = verify_pass.choose(self.scheduler, spans)
        except Exception as exc:  # the server keeps serving; these requests end with the cause
            logger.exception("Lynx decode: verify pass failed")
            for req in reqs:
                self._fail(req, f"verify pass failed: {exc!r}")
            return
        for span, chosen in zip(spans, choices, strict=True):
            req, state = span.req, state_of(span.req)
            verify_pass.settle(self.scheduler, span, chosen)
            attach(req, self.metrics(req))
            if req.finished():
                state.move(Phase.EXACT)
                self._finish(req, checkpoint=True)
            else:
                state.move(Phase.REQUEUED)
                self.scheduler.waiting_queue.append(req)

    # --- holding, parking, failing, finishing --------------------------------------------------

    def _hold_new(self) -> None:
        """Requests that may not speculate: stream their first token now, then hold them."""
        waiting = self.scheduler.waiting_queue
        unparked = (Phase.FRESH, Phase.DRAFTING)
        for req in [r for r in waiting if (s := state_of(r)) is not None and s.phase in unparked and s.cap == 0]:
            req.update_finish_state()
            if req.finished():
                continue  # SGLang's prebuilt path answers and releases it
            waiting.remove(req)
            self.scheduler.output_streamer.stream_output([req], req.return_logprob)
            self._hold(req)

    def _park(self, running_batch) -> None:
        capped = []
        for req in running_batch.reqs:
            state = state_of(req)
            if state is None or not state.phase.on_anchor:
                continue
            if state.speculated(len(req.output_ids)) >= self._cap(req, state):
                capped.append(req)
        if capped:
            self._remove_from(running_batch, capped)
            for req in capped:
                self._hold(req)

    def _cap(self, req, state: SpecState) -> int:
        room_left = req.sampling_params.max_new_tokens - state.verified
        return max(0, min(state.cap, room_left))

    def _hold(self, req) -> None:
        state = state_of(req)
        state.move(park_target(state.phase))

    @staticmethod
    def _remove_from(batch, reqs: list) -> None:
        gone = {id(req) for req in reqs}
        if any(id(req) in gone for req in batch.reqs):
            batch.filter_batch(keep_indices=[i for i, r in enumerate(batch.reqs) if id(r) not in gone])

    def _fail(self, req, reason: str, running_batch=None) -> None:
        """Drop held-back tokens, answer the client with `reason`, free every slot."""
        from sglang.srt.managers.schedule_batch import FINISH_ABORT

        logger.error("Lynx decode: request %s failed: %s", req.rid, reason)
        state = state_of(req)
        if running_batch is not None:
            self._remove_from(running_batch, [req])
        if req in self.scheduler.waiting_queue:
            self.scheduler.waiting_queue.remove(req)
        commit.roll_back(req, state.verified)
        state.move(Phase.FAILED)
        req.finished_reason = FINISH_ABORT(reason, HTTPStatus.INTERNAL_SERVER_ERROR)
        self._finish(req, checkpoint=False)

    def _finish(self, req, checkpoint: bool) -> None:
        """Release a finished request's KV (into the radix cache if `checkpoint`) and answer it."""
        from sglang.srt.mem_cache.common import release_kv_cache

        if not req.finished():
            req.update_finish_state()  # applies a pending abort (to_finish), dropping held-back tokens
        release_kv_cache(req, self.scheduler.tree_cache, checkpoint=checkpoint)
        self.scheduler.output_streamer.stream_output([req], req.return_logprob)
        self._drop(req)

    def _drop(self, req) -> None:
        if self.reqs.pop(req.rid, None) is not None and self.prometheus is not None:
            self.prometheus.record(self.metrics(req))
        self.side.forget(state_of(req).room)

