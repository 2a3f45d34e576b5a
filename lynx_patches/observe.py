"""Lynx state in SGLang's `/server_info` (`internal_states[i]["lynx"]`).

Reports the scheduler's free KV slots and request rows, so an operator (and the
tests) can check that failed and rolled-back requests leak nothing.
"""

from __future__ import annotations

from lynx_patches import targets
from lynx_patches.selfcheck import Hook


def internal_state(result, controller, *args, **kwargs):
    """AFTER `SchedulerInternalStateController.get_internal_state`."""
    scheduler = controller.scheduler
    config = getattr(scheduler.server_args, "_lynx", None)
    if config is None:
        return None
    result.internal_state["lynx"] = {
        "mode": config.mode,
        "preset": config.preset,
        "kv_free_slots": int(scheduler.token_to_kv_pool_allocator.available_size()),
        "kv_total_slots": int(scheduler.max_total_num_tokens),
        "req_rows_free": int(scheduler.req_to_token_pool.available_size()),
    }
    return None


HOOKS = (Hook(targets.SCHEDULER_INTERNAL_STATE, internal_state, "AFTER"),)
