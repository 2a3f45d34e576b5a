"""The table of every Lynx hook; registration and the self-check both read it."""

from __future__ import annotations

from lynx_patches.selfcheck import Hook, verify


def all_hooks() -> tuple[Hook, ...]:
    from lynx_patches import cli, startup

    return cli.HOOKS + startup.HOOKS


def verify_hooks() -> None:
    """Raise `LynxHookError` unless every Lynx hook is live."""
    verify(all_hooks())
