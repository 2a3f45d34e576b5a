"""Where a recorded result came from: the commit of the checkout that produced it."""

from __future__ import annotations

import subprocess
from pathlib import Path


def commit(folder: Path) -> str:
    """The short commit of the git checkout holding `folder`, or ``"unknown"`` outside one."""
    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=folder)
    return done.stdout.strip() or "unknown"
