"""The table of every Lynx hook, its registration with SGLang, and the guard that proves it live.

The table imports the modules whose hooks it lists; none of them imports it
back. The two hooks that check the whole table (the `--lynx` flag when it is
parsed, and each scheduler process as it starts) live here, beside it, so
that Lynx refuses to run half-installed.
"""

from __future__ import annotations

import argparse
import logging

from sglang.srt.plugins.hook_registry import HookRegistry, HookType

from lynx_patches import cli, loopback, metrics, observe, stock, targets
from lynx_patches.pd import layer_hooks, registry
from lynx_patches.selfcheck import Hook, LynxHookError, unresolved, verify
from lynx_patches.speculate import hooks as speculate
from lynx_patches.startup import lynx_config_of

logger = logging.getLogger(__name__)


def verify_hooks() -> None:
    """Raise `LynxHookError` unless every Lynx hook is live and `lynx` is a transfer backend."""
    verify(all_hooks())
    missing = unresolved(targets.USED)
    if missing:
        raise LynxHookError(f"this SGLang lacks what Lynx uses: {', '.join(missing)}; Lynx needs SGLang 0.5.23")
    if not registry.backend_installed():
        raise LynxHookError("the 'lynx' transfer backend is not registered with SGLang")


class _EnableLynx(argparse.Action):
    """`--lynx`: turn Lynx on, after proving that its hooks are live."""

    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest, nargs=0, default=False, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        try:
            verify_hooks()
        except LynxHookError as exc:
            parser.error(str(exc))
        setattr(namespace, self.dest, True)


def add_cli_args(result, parser: argparse.ArgumentParser):
    """AFTER `ServerArgs.add_cli_args`: the Lynx option group, its `--lynx` checking every hook."""
    cli.add_options(parser, _EnableLynx)


def scheduler_init(*args, **kwargs):
    """BEFORE `Scheduler.__init__(self, server_args, port_args, ...)`: a Lynx scheduler checks every hook."""
    server_args = kwargs.get("server_args", args[1] if len(args) > 1 else None)
    config = lynx_config_of(server_args)
    if config is not None:
        verify_hooks()
        logger.info("Lynx enabled in this scheduler: %s", config)


GUARD_HOOKS = (
    Hook(targets.SERVER_ARGS_ADD_CLI_ARGS, add_cli_args, "AFTER"),
    Hook(targets.SCHEDULER_INIT, scheduler_init, "BEFORE"),
)


def all_hooks() -> tuple[Hook, ...]:
    return (
        GUARD_HOOKS
        + cli.HOOKS
        + observe.HOOKS
        + loopback.HOOKS
        + metrics.HOOKS
        + registry.HOOKS
        + layer_hooks.HOOKS
        + speculate.HOOKS
        + stock.HOOKS
    )


def register() -> None:
    """Register every Lynx hook with SGLang's HookRegistry, then the `lynx` transfer backend."""
    for hook in all_hooks():
        HookRegistry.register(hook.target, hook.fn, HookType[hook.kind])
    # After the hooks: should this fail, `--lynx` still parses and the
    # self-check reports the missing backend instead of an unknown flag.
    registry.install_backend_choice()
