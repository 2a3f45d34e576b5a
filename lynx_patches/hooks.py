"""The table of every Lynx hook; registration and the self-check both read it."""

from __future__ import annotations

from lynx_patches.selfcheck import Hook, LynxHookError, unresolved, verify


def all_hooks() -> tuple[Hook, ...]:
    from lynx_patches import cli, loopback, metrics, observe, startup, stock
    from lynx_patches.pd import layer_hooks, registry
    from lynx_patches.speculate import hooks as speculate

    return (
        cli.HOOKS
        + startup.HOOKS
        + observe.HOOKS
        + loopback.HOOKS
        + metrics.HOOKS
        + registry.HOOKS
        + layer_hooks.HOOKS
        + speculate.HOOKS
        + stock.HOOKS
    )


def verify_hooks() -> None:
    """Raise `LynxHookError` unless every Lynx hook is live and `lynx` is a transfer backend."""
    from lynx_patches.pd.registry import backend_installed
    from lynx_patches.targets import USED

    verify(all_hooks())
    missing = unresolved(USED)
    if missing:
        raise LynxHookError(f"this SGLang lacks what Lynx uses: {', '.join(missing)}; Lynx needs SGLang 0.5.23")
    if not backend_installed():
        raise LynxHookError("the 'lynx' transfer backend is not registered with SGLang")
