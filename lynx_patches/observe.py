"""Lynx state in SGLang's `/server_info` (`internal_states[i]["lynx"]`), and in `/health`.

`/server_info` reports the scheduler's free KV slots and request rows (so an
operator, and the tests, can check that failed and rolled-back requests leak
nothing), the rooms the transfer holds, the messages it dropped, and whether
its threads are healthy. A rank whose Lynx threads keep crashing ("broken")
also fails `/health`: SGLang's health check is a one-token request that
passes as soon as the scheduler answers anything, so the scheduler leaves
that request unanswered.
"""

from __future__ import annotations

import logging

from lynx_patches import targets
from lynx_patches.pd.registry import manager_of
from lynx_patches.selfcheck import Hook
from lynx_patches.startup import lynx_config_of

logger = logging.getLogger(__name__)


def internal_state(result, controller, *args, **kwargs):
    """AFTER `SchedulerInternalStateController.get_internal_state`."""
    scheduler = controller.scheduler
    config = lynx_config_of(scheduler.server_args)
    if config is None:
        return None
    state = {
        "mode": config.mode,
        "preset": config.preset,
        "kv_free_slots": int(scheduler.token_to_kv_pool_allocator.available_size()),
        "kv_total_slots": int(scheduler.max_total_num_tokens),
        "req_rows_free": int(scheduler.req_to_token_pool.available_size()),
    }
    manager = manager_of(scheduler)
    if manager is not None:
        state.update(
            healthy=manager.broken is None,
            broken=manager.broken,
            transfer_rooms=manager.side.live_count(),
            rooms_by_state=manager.side.rooms_by_state(),
            dropped_messages=manager.side.dropped,
        )
        if manager.is_decode:
            state["data_endpoint"] = manager.side.data_endpoint
        else:
            state["segments_sent"] = dict(manager.side.segments_sent)
    result.internal_state["lynx"] = state
    return None


def handle_generate_request(original, scheduler, recv_req, *args, **kwargs):
    """AROUND `Scheduler.handle_generate_request`: a broken Lynx rank leaves health checks unanswered."""
    from sglang.srt.managers.utils import is_health_check_generate_req

    manager = manager_of(scheduler)
    if manager is not None and manager.broken is not None and is_health_check_generate_req(recv_req):
        logger.error("Lynx: failing the health check: %s", manager.broken)
        return None
    return original(scheduler, recv_req, *args, **kwargs)


HOOKS = (
    Hook(targets.SCHEDULER_INTERNAL_STATE, internal_state, "AFTER"),
    Hook(targets.SCHEDULER_HANDLE_GENERATE, handle_generate_request, "AROUND"),
)
