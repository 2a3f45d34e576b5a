"""Prove at start-up that every Lynx hook is live in SGLang, and that what Lynx uses exists.

SGLang's plugin loader logs and swallows a hook that fails to apply, which
would leave Lynx half-installed. The check resolves each hook's target again
and walks the wrapper chain looking for the Lynx function.

The names Lynx calls, reads or overrides without hooking them
(`lynx_patches.targets.USED`) are resolved too, in three forms:

* ``pkg.mod.Owner.name``: a module attribute, class, method or class attribute;
* ``pkg.mod.Class.method(a, b)``: a callable that takes parameters ``a`` and ``b``;
* ``pkg.mod.Class().name``: an attribute an instance of ``Class`` has, found
  among its classes' attributes and declared fields (dataclass, msgspec,
  ``__slots__``) or as a ``self.name = ...`` assignment in their methods.
"""

from __future__ import annotations

import dis
import functools
import inspect
import pkgutil
import types
from collections.abc import Callable, Iterable
from dataclasses import dataclass

_UNRESOLVED = (ImportError, AttributeError, ValueError, TypeError)


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
    """The paths (in the forms above) that do not resolve in this SGLang."""
    return [path for path in paths if not resolves(path)]


def resolves(path: str) -> bool:
    """Whether `path` names something this SGLang has (see the module docstring for its forms)."""
    try:
        if "()." in path:
            owner, name = path.split("().")
            return name in instance_attributes(pkgutil.resolve_name(owner))
        if path.endswith(")"):
            target, params = path[:-1].split("(")
            wanted = {p.strip() for p in params.split(",")} - {""}
            return wanted <= set(inspect.signature(_live_function(target)).parameters)
        _live_function(path)
        return True
    except _UNRESOLVED:
        return False


@functools.cache
def instance_attributes(cls: type) -> frozenset[str]:
    """Every attribute name an instance of `cls` gets from its classes' definitions."""
    names: set[str] = set()
    for klass in cls.__mro__[:-1]:  # without `object`
        names.update(vars(klass))
        names.update(vars(klass).get("__annotations__", {}))
        names.update(_assigned_on_self(klass))
    return frozenset(names)


def _assigned_on_self(klass: type) -> set[str]:
    """Names that the methods of `klass` assign as ``self.<name>`` (read from their bytecode)."""
    names: set[str] = set()
    for code in _codes(klass):
        previous = None
        for instruction in dis.get_instructions(code):
            if instruction.opname == "STORE_ATTR" and previous is not None and previous.argval == "self":
                names.add(instruction.argval)
            previous = instruction
    return names


def _codes(klass: type):
    """The code objects of the functions defined in `klass`, nested ones included."""
    pending = []
    for value in vars(klass).values():
        for fn in _functions(value):
            code = getattr(inspect.unwrap(fn), "__code__", None)
            if code is not None:
                pending.append(code)
    while pending:
        code = pending.pop()
        yield code
        pending.extend(const for const in code.co_consts if isinstance(const, types.CodeType))


def _functions(value) -> tuple:
    if isinstance(value, (classmethod, staticmethod)):
        return (value.__func__,)
    if isinstance(value, property):
        return tuple(fn for fn in (value.fget, value.fset, value.fdel) if fn is not None)
    if isinstance(value, functools.cached_property):
        return (value.func,)
    return (value,) if callable(value) else ()


def is_applied(target: str, hook: Callable) -> bool:
    """True if `hook` is captured by one of the wrappers around `target`."""
    try:
        fn = _live_function(target)
    except _UNRESOLVED:
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
