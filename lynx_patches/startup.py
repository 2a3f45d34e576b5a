"""Scheduler start-up: refuse to serve with Lynx half-installed."""

from __future__ import annotations

import logging

from lynx_patches import targets
from lynx_patches.selfcheck import Hook

logger = logging.getLogger(__name__)


def lynx_config_of(server_args):
    """The `LynxConfig` a `--lynx` server carries, or None."""
    return getattr(server_args, "_lynx", None)


def current_config():
    """The `LynxConfig` of this SGLang process's published server args, or None."""
    from sglang.srt.runtime_context import get_server_args

    try:
        return lynx_config_of(get_server_args())
    except (AttributeError, ValueError):
        return None


def scheduler_init(*args, **kwargs):
    """BEFORE `Scheduler.__init__(self, server_args, port_args, ...)`."""
    from lynx_patches.hooks import verify_hooks

    server_args = kwargs.get("server_args", args[1] if len(args) > 1 else None)
    config = lynx_config_of(server_args)
    if config is not None:
        verify_hooks()
        logger.info("Lynx enabled in this scheduler: %s", config)


HOOKS = (Hook(targets.SCHEDULER_INIT, scheduler_init, "BEFORE"),)
