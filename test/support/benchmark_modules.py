"""Modules of `benchmark/` (scripts, not a package) imported for their unit tests."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

BENCHMARK = Path(__file__).resolve().parents[2] / "benchmark"


def load(*names: str) -> tuple:
    """The named modules of `benchmark/`, imported with it on the path only while they load."""
    sys.path.insert(0, str(BENCHMARK))
    try:
        return tuple(importlib.import_module(name) for name in names)
    finally:
        sys.path.remove(str(BENCHMARK))
