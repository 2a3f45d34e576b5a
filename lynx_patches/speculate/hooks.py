"""Thin hooks into SGLang's decode scheduler; the logic is in `controller`, `idle` and friends."""

from __future__ import annotations

import torch
from lynx.sampling import draw

from lynx_patches import targets
from lynx_patches.metrics import attach
from lynx_patches.pd.registry import manager_of
from lynx_patches.selfcheck import Hook
from lynx_patches.speculate import attention, parallel
from lynx_patches.speculate.controller import SpecController
from lynx_patches.speculate.state import (
    coupled_rows,
    in_anchor_phase,
    request_seed,
    sampling_rule,
    state_of,
)
from lynx_patches.startup import lynx_config_of

CONTROLLER_ATTR = "_lynx_controller"


def controller_of(scheduler):
    """The scheduler's `SpecController` on a Lynx decode server, else None (created on first use)."""
    controller = getattr(scheduler, CONTROLLER_ATTR, None)
    if controller is None:
        manager = manager_of(scheduler)
        if manager is None or not manager.is_decode:
            return None
        controller = SpecController(scheduler, manager.side)
        setattr(scheduler, CONTROLLER_ATTR, controller)
        manager.notify_status_changes(controller.idle.wake)  # a transfer moved: stop idling
    return controller


def commit_transfer(original, queue, decode_req):
    """AROUND `DecodeTransferQueue._commit_transfer_to_req`: adopt lynx requests, record timings.

    A Lynx receiver carries its decode side as `lynx_side`; other receivers (SGLang's warmup
    fake, another backend's) have none and are left to SGLang.
    """
    req = decode_req.req
    side = getattr(decode_req.kv_receiver, "lynx_side", None)
    if side is None:
        return original(queue, decode_req)
    room = req.bootstrap_room
    residual_pending = side.num_streams(room) > 1
    if residual_pending:
        side.hand_over(room)  # the residual outlives SGLang's receiver
    timings = {**side.timings(room), "sent_as": side.sent_as(room)}
    result = original(queue, decode_req)
    controller = controller_of(queue.scheduler)
    if req.finished():  # aborted at commit: nothing will consume the room
        if residual_pending:
            side.forget(room)
        attach(req, {"mode": side.config.mode, **timings})
    else:
        controller.adopt(req, residual_pending, timings)
        attach(req, controller.metrics(req))
    return result


def next_decode_batch(original, scheduler, running_batch):
    """AROUND `get_next_disagg_decode_batch_to_run`: verify, fail and park; upgrade requests
    whose first token went out in this batch; mark seeded rows."""
    controller = controller_of(scheduler)
    if controller is None:
        return original(scheduler, running_batch)
    plan = original(scheduler, controller.before_schedule(running_batch))
    controller.after_schedule(plan.running_batch)
    batch = plan.batch_to_run
    if batch is not None and batch.sampling_info is not None:
        batch.sampling_info.lynx_coupled_rows = controller.coupled_rows(batch)
    return plan


def new_prebuilt_batch(result, scheduler, *args, **kwargs):
    """AFTER `get_new_prebuilt_batch`: verified requests get their penalizer history back."""
    controller = getattr(scheduler, CONTROLLER_ATTR, None)
    if result is not None and controller is not None:
        controller.after_prebuilt(result)
    return None


def on_idle(result, scheduler, *args, **kwargs):
    """AFTER `Scheduler.on_idle`: sleep while requests wait for KV and nothing else can run."""
    controller = getattr(scheduler, CONTROLLER_ATTR, None)
    if controller is not None:
        controller.idle.wait()
    return None


def inflight_reqs(result, scheduler, *args, **kwargs):
    """AFTER `Scheduler.collect_inflight_reqs`: parked requests are in flight (aborts reach them)."""
    controller = getattr(scheduler, CONTROLLER_ATTR, None)
    if controller is None or not controller.parked:
        return None
    return set(result) | set(controller.parked)


def next_prefill_batch(original, scheduler, *args, **kwargs):
    """AROUND `get_next_disagg_prefill_batch_to_run`: the first token of a seeded request is
    drawn with the same seeded noise as the decode server's (SGLang ignores `sampling_seed`
    unless deterministic inference is on), so a seeded request repeats from its first token."""
    plan = original(scheduler, *args, **kwargs)
    batch = plan.batch_to_run
    if batch is not None and batch.sampling_info is not None and lynx_config_of(scheduler.server_args):

        def choose(req):
            rule, seed = sampling_rule(req.sampling_params), request_seed(req)
            return (rule, seed) if rule is not None and seed is not None else None

        batch.sampling_info.lynx_coupled_rows = coupled_rows(batch.reqs, choose)
    return plan


def sampler_forward(original, sampler, logits_output, sampling_info, *args, **kwargs):
    """AROUND `Sampler.forward`: draw the rows of seeded Lynx requests with `lynx.sampling.draw`.

    The returned logprob of such a row is that of the drawn token under SGLang's
    formula for a sampled row (log-softmax of the processed logits over the temperature).
    """
    rows = getattr(sampling_info, "lynx_coupled_rows", None)
    if not rows:
        return original(sampler, logits_output, sampling_info, *args, **kwargs)
    logits = logits_output.next_token_logits[[row for row, *_ in rows]].clone()
    token_ids = original(sampler, logits_output, sampling_info, *args, **kwargs)
    logprobs = logits_output.next_token_logprobs
    for (row, rule, seed, position), row_logits in zip(rows, logits, strict=True):
        token = draw(row_logits, rule, seed, position)
        token_ids[row] = token
        if logprobs is not None:
            logprobs[row] = torch.log_softmax(row_logits.float() / rule.temperature, dim=-1)[token]
    return token_ids


def is_fully_idle(result, scheduler, *args, **kwargs):
    """AFTER `Scheduler.is_fully_idle`: parked requests keep the scheduler (and its KV) busy."""
    controller = getattr(scheduler, CONTROLLER_ATTR, None)
    return False if controller is not None and controller.busy else None


def stream_accept(original, accumulator, *, req):
    """AROUND `_GenerationStreamAccumulator.accept`: never stream a held-back token, nor
    an empty chunk when a verified or held request passes SGLang's prebuilt path again."""
    state = state_of(req)
    if state is not None and not req.finished():
        if req.send_token_offset >= (state.verified if state.phase.on_anchor else len(req.output_ids)):
            return None
    return original(accumulator, req=req)


def update_finish_state(original, req, *args, **kwargs):
    """AROUND `Req.update_finish_state`: no finish (EOS, stop, length) on unverified tokens."""
    if in_anchor_phase(req) and len(req.output_ids) > state_of(req).verified:
        if not req.to_finish:
            return None
        del req.output_ids[state_of(req).verified :]
    return original(req, *args, **kwargs)


HOOKS = (
    Hook(targets.DECODE_COMMIT_TRANSFER, commit_transfer, "AROUND"),
    Hook(targets.DECODE_NEXT_BATCH, next_decode_batch, "AROUND"),
    Hook(targets.DECODE_NEW_PREBUILT_BATCH, new_prebuilt_batch, "AFTER"),
    Hook(targets.PREFILL_NEXT_BATCH, next_prefill_batch, "AROUND"),
    Hook(targets.SCHEDULER_IS_FULLY_IDLE, is_fully_idle, "AFTER"),
    Hook(targets.SCHEDULER_ON_IDLE, on_idle, "AFTER"),
    Hook(targets.SCHEDULER_INFLIGHT_REQS, inflight_reqs, "AFTER"),
    Hook(targets.SAMPLER_FORWARD, sampler_forward, "AROUND"),
    Hook(targets.STREAM_ACCEPT, stream_accept, "AROUND"),
    Hook(targets.REQ_UPDATE_FINISH_STATE, update_finish_state, "AROUND"),
    Hook(targets.TORCH_NATIVE_EXTEND, attention.forward_extend, "AROUND"),
    Hook(targets.TOKENIZER_SEND_ONE_REQUEST, parallel.send_one_request, "BEFORE"),
)
