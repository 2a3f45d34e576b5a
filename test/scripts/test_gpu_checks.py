"""The GPU check scripts run from a clean checkout: their options parse, and without a GPU they say so and exit 2."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ("gpu_check_kernels.py", "gpu_check_layer_streaming.py")


def run(script: str, *args: str) -> subprocess.CompletedProcess:
    path = os.pathsep.join(["python", "kernels", ".", "test/support"])
    env = {**os.environ, "PYTHONPATH": path, "CUDA_VISIBLE_DEVICES": ""}
    command = [sys.executable, str(ROOT / "scripts" / script), *args]
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.slow
@pytest.mark.parametrize("script", SCRIPTS)
def test_a_gpu_check_without_a_gpu_checks_nothing_and_says_so(script):
    help_text = run(script, "--help")
    assert help_text.returncode == 0 and "Exit status" in help_text.stdout
    result = run(script)
    assert result.returncode == 2, result.stderr
    assert "no CUDA GPU visible; nothing checked" in result.stderr
