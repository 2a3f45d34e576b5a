"""Checks shared by the validating dataclasses of `lynx` (a leaf: imports nothing of `lynx`)."""

from __future__ import annotations


def is_int(value: object) -> bool:
    """An `int` that is not a `bool` (``True`` is an `int` to Python, never a count or a width here)."""
    return isinstance(value, int) and not isinstance(value, bool)
