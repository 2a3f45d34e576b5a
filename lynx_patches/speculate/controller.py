"""Anchor phase, verify and rollback for ``lynx``-mode requests on a decode server.

Runs on the scheduler thread, once per loop iteration before the next decode
batch is formed (`before_schedule`), so the KV it upgrades or rewrites is
never read by a forward pass in flight. Per iteration it:

1. fails requests whose residual failed or timed out: held-back tokens are
   dropped, the client gets the reason, every slot is freed;
2. verifies every request whose residual has landed, all in one pass:
   apply what the data thread left of each prompt's upgrade, recompute the
   held-back tokens in one forward (`verify`), choose each position's token
   as step-by-step decoding would (`predict`), keep the agreeing prefix plus
   the full-precision correction and replay it through SGLang's finish rules
   (`commit`), free the rest, and return the requests to SGLang's queue;
3. streams the first token of requests that may not speculate (computed by
   the prefill on full KV) and holds them, and parks requests that reached
   their speculative cap, until their residual lands.
"""

from __future__ import annotations

import logging
import time
from http import HTTPStatus

from lynx.request_lifecycle import Phase, first_phase, park_target, settle_target
from lynx.speculation import DraftWindow

from lynx_patches.speculate import commit
from lynx_patches.speculate.agree import RankAgreement, Readiness
from lynx_patches.speculate.idle import IdleWait
from lynx_patches.speculate.predict import penalizer_rows, predict
from lynx_patches.speculate.state import (
    ATTR,
    SpecState,
    coupled_rows,
    noise_seed,
    sampling_rule,
    state_of,
    why_not_speculate,
)
from lynx_patches.speculate.verify import Span, verify_logits

logger = logging.getLogger(__name__)

# Drafts a grammar request may hold: its grammar is rolled back over them,
# and grammar backends bound how far back they go (xgrammar: 200 tokens).
GRAMMAR_MAX_DRAFTS = 128


class SpecController:
    """One per decode scheduler of a Lynx server (all modes; ``lynx`` and ``auto`` requests sent in two
    streams speculate)."""

    def __init__(self, scheduler, side, agreement: RankAgreement | None = None) -> None:
        self.scheduler = scheduler
        self.side = side
        self.config = side.config
        self.agreement = agreement or RankAgreement.of(scheduler)
        self.reqs: dict[str, object] = {}
        # A residual applied here that another decode rank still waits for: this rank's idle
        # wait must not sleep (the others pace the loop; it waits in their next collective).
        self.waiting_on_peers = False
        self.idle = IdleWait(scheduler, side, parked=lambda: self.busy, ready=lambda: self.waiting_on_peers)
        self.window = DraftWindow(self.config.max_speculative_tokens if self.config.speculates else 0)
        self.prometheus = None
        if scheduler.metrics_reporter.enable_metrics:
            from lynx_patches.prometheus import LynxMetrics

            self.prometheus = LynxMetrics(self.config.mode)

    # --- adoption (transfer committed, scheduler thread) -------------------------------------

    def adopt(self, req, residual_pending: bool, timings: dict) -> SpecState:
        """Take over a request whose anchor has landed (a residual it lost fails it next tick).

        `timings` are the transfer's milestones so far; the room may be gone already.
        """
        reason = why_not_speculate(req)
        cap = 0 if reason is not None else self.config.max_speculative_tokens
        if req.grammar is not None:
            cap = min(cap, GRAMMAR_MAX_DRAFTS)
        params = req.sampling_params
        state = SpecState(
            room=req.bootstrap_room,
            verified=len(req.output_ids),
            cap=cap,
            rule=sampling_rule(params),
            seed=noise_seed(req),
            timings=dict(timings),
            phase=first_phase(residual_pending),
        )
        if state.phase.on_anchor:
            if reason is not None:
                logger.info("Lynx decode: request %s waits for its residual: %s", req.rid, reason)
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

    # --- per iteration -------------------------------------------------------------------------

    def before_schedule(self, running_batch):
        self.side.landed.clear()  # every landing after this is seen now or wakes the next idle wait
        self.window.tick(time.monotonic(), running=bool(getattr(running_batch, "reqs", None)))
        self.side.draft_window_s = self.window.seconds
        awaited = []
        for req in list(self.reqs.values()):
            state = state_of(req)
            if req.finished():
                self._drop(req)
                continue
            if state.phase not in (Phase.DRAFTING, Phase.PARKED):
                continue
            if req.grammar is not None and not state.grammar_done:
                state.grammar_drafts = state.speculated(len(req.output_ids))
                state.grammar_done = req.grammar.is_terminated()
            if state.phase is Phase.PARKED and req.to_finish:
                self._finish(req, checkpoint=False)  # aborted while it waited
            else:
                awaited.append(req)
        agreed, local, self.waiting_on_peers = self._residuals(awaited)
        failed = [(req, own) for req, verdict, own in zip(awaited, agreed, local) if verdict is Readiness.FAILED]
        if failed:
            reasons = self.agreement.reasons([own for _, own in failed])
            for (req, _), reason in zip(failed, reasons, strict=True):
                self._fail(req, f"residual KV failed: {reason}", running_batch)
        landed = [req for req, verdict in zip(awaited, agreed) if verdict is Readiness.READY]
        if landed:
            self._verify_landed(landed, running_batch)
        self._hold_new()
        self._park(running_batch)
        return running_batch

    def after_schedule(self, running_batch) -> None:
        """Requests adopted this iteration have streamed their first token: apply what has landed
        of their residual now, before the forward (not before the first token, whose time it is)."""
        fresh = []
        for req in list(self.reqs.values()):
            state = state_of(req)
            if not state.phase.fresh:
                continue
            state.move(settle_target(state.phase))
            if req.finished() or state.speculated(len(req.output_ids)):
                continue
            fresh.append(req)
        agreed, _, waiting = self._residuals(fresh)  # a failure is left to the next `before_schedule`
        self.waiting_on_peers |= waiting
        landed = [req for req, verdict in zip(fresh, agreed) if verdict is Readiness.READY]
        if landed:
            self._verify_landed(landed, running_batch)

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

    # --- verify --------------------------------------------------------------------------------

    def _upgrade(self, state: SpecState) -> bool:
        """Apply what has landed of the residual (segment by segment); True once all of it is in."""
        started = time.perf_counter()
        done = self.side.apply_residual(state.room)
        state.profile["upgrade_s"] = state.profile.get("upgrade_s", 0.0) + time.perf_counter() - started
        return done

    def _residuals(self, reqs: list) -> tuple[list[Readiness], list[str | None], bool]:
        """Apply what has landed of each request's residual on this rank, then agree with the other
        decode ranks: ``(agreed readiness, this rank's failure reasons)``, one each per request, and
        whether a residual applied here waits for another rank.

        Every rank calls this in the same iteration with the same requests in
        the same order (the controller's state is alike on every rank), so the
        one all-reduce inside lines up.
        """
        local, reasons = [], []
        for req in reqs:
            state = state_of(req)
            failure = self.side.check(state.room)
            if failure is None and self.side.room_state(state.room) is None:
                failure = "the transfer was lost"
            reasons.append(failure)
            if failure is not None:
                local.append(Readiness.FAILED)
            else:
                local.append(Readiness.READY if self._upgrade(state) else Readiness.PENDING)
        agreed = self.agreement.agree(local)
        waiting = any(own is Readiness.READY and group is Readiness.PENDING for own, group in zip(local, agreed))
        return agreed, reasons, waiting

    def _verify_landed(self, landed: list, running_batch) -> None:
        """Verify every request whose KV is now full precision, those with held-back tokens in one pass."""
        to_verify = []
        for req in landed:
            state = state_of(req)
            req.skip_radix_cache_insert = state.barred_from_tree
            if state.speculated(len(req.output_ids)) > 0:
                state.move(Phase.VERIFYING)
                to_verify.append(req)
                continue
            was_parked = state.phase is Phase.PARKED
            state.move(Phase.EXACT)
            if req in running_batch.reqs:
                from sglang.srt.mem_cache.common import checkpoint_kv_cache

                checkpoint_kv_cache(req, self.scheduler.tree_cache)
            if was_parked:
                self.scheduler.waiting_queue.append(req)
            self._attach_metrics(req)
        if to_verify:
            self._verify(to_verify, running_batch)

    def _verify(self, reqs: list, running_batch) -> None:
        self._remove_from(running_batch, reqs)
        spans = []
        for req in reqs:
            state = state_of(req)
            if req.grammar is not None and state.grammar_drafts:
                req.grammar.rollback(state.grammar_drafts)  # back to the verified tokens
            state.grammar_drafts = 0
            spans.append(Span(req, state.verified - 1, state.speculated(len(req.output_ids))))
        started = time.perf_counter()
        try:
            logits = verify_logits(self.scheduler, spans)
            forward_done = time.perf_counter()
            choices = predict(self.scheduler, spans, logits)
        except Exception as exc:  # the server keeps serving; these requests end with the cause
            logger.exception("Lynx decode: verify pass failed")
            for req in reqs:
                self._fail(req, f"verify pass failed: {exc!r}")
            return
        predict_done = time.perf_counter()
        for span, chosen in zip(spans, choices, strict=True):
            state = state_of(span.req)
            state.verify_batch = len(spans)
            state.profile["forward_s"] = forward_done - started
            state.profile["predict_s"] = predict_done - forward_done
            self._commit(span, chosen)

    def _commit(self, span: Span, choices: list) -> None:
        started = time.perf_counter()
        req, state = span.req, state_of(span.req)
        verdict = commit.apply(self.scheduler, span, choices)
        state.speculative_tokens += verdict.speculative
        state.accepted_tokens += verdict.accepted
        state.rollbacks += int(verdict.rolled_back)
        state.verified = len(req.output_ids)
        state.profile["commit_s"] = time.perf_counter() - started
        self._attach_metrics(req)
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

    def _attach_metrics(self, req) -> None:
        from lynx_patches.metrics import attach

        attach(req, self.metrics(req))

