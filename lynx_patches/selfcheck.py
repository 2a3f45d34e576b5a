"""Prove at start-up that every Lynx hook is live in SGLang.

SGLang's plugin loader logs and swallows a hook that fails to apply, which
would leave Lynx half-installed. The check resolves each hook's target again
and walks the wrapper chain looking for the Lynx function.
"""

from __future__ import annotations

import pkgutil
from collections.abc import Callable, Iterable
from dataclasses import dataclass


class LynxHookError(RuntimeError):
    """A Lynx hook is not applied; Lynx refuses to run half-installed."""


@dataclass(frozen=True)
class Hook:
    """One hook: SGLang attribute path, Lynx function, SGLang HookType name."""

    target: str
    fn: Callable
    kind: str


def missing(hooks: Iterable[Hook]) -> list[str]:
    """Targets whose Lynx hook is not in the live wrapper chain."""
    return [h.target for h in hooks if not is_applied(h.target, h.fn)]


def verify(hooks: Iterable[Hook]) -> None:
    """Raise LynxHookError naming every hook that is not applied."""
    absent = missing(hooks)
    if absent:
        raise LynxHookError(
            "Lynx hooks were not applied to: "
            + ", ".join(absent)
            + ". SGLang logged the cause ('Failed to apply hooks'). Lynx needs "
            "SGLang 0.5.23; check `pip show sglang`, and that SGLANG_PLUGINS "
            "(if set) includes 'lynx'."
        )


def unresolved(paths: Iterable[str]) -> list[str]:
    """The SGLang attribute paths that do not resolve in this SGLang."""
    absent = []
    for path in paths:
        try:
            _live_function(path)
        except (ImportError, AttributeError, ValueError):
            absent.append(path)
    return absent


def is_applied(target: str, hook: Callable) -> bool:
    """True if `hook` is captured by one of the wrappers around `target`."""
    try:
        fn = _live_function(target)
    except (ImportError, AttributeError, ValueError):
        return False
    seen = set()
    while fn is not None and id(fn) not in seen:
        seen.add(id(fn))
        cells = getattr(fn, "__closure__", None) or ()
        if any(_cell_value(cell) is hook for cell in cells):
            return True
        fn = getattr(fn, "__wrapped__", None)
    return False


def _live_function(target: str):
    owner_path, name = target.rsplit(".", 1)
    owner = pkgutil.resolve_name(owner_path)
    raw = owner.__dict__.get(name) if isinstance(owner, type) else None
    if isinstance(raw, (classmethod, staticmethod)):
        return raw.__func__
    return getattr(owner, name)


def _cell_value(cell):
    try:
        return cell.cell_contents
    except ValueError:
        return None
