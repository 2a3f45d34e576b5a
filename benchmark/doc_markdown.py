"""Markdown the reports and the docs' generated blocks share: table lines, counted nouns."""

from __future__ import annotations

from collections.abc import Iterable, Sequence


def line(cells: Iterable[str]) -> str:
    """One row: ``| a | b |``."""
    return "| " + " | ".join(cells) + " |"


def head(names: Sequence[str]) -> list[str]:
    """The header row and the rule under it."""
    return [line(names), "|" + " --- |" * len(names)]


def table(names: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    """Header, rule and one line per row."""
    return [*head(names), *(line(r) for r in rows)]


def count(number: int, noun: str) -> str:
    """``1 run``, ``3 runs``."""
    return f"{number} {noun}" + ("" if number == 1 else "s")
