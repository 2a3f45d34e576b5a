"""The GPU check scripts run from a clean checkout: their options parse, and without a GPU they say so and exit 2.
The decode side's check also runs its checks on a CPU pool (`--device cpu`, a dry run)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ("gpu_check_kernels.py", "gpu_check_layer_streaming.py", "gpu_check_decode_upgrade.py")


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


@pytest.mark.slow
def test_the_decode_upgrade_check_passes_its_dry_run_on_a_cpu_pool(tmp_path):
    out = tmp_path / "decode_upgrade.json"
    small = ("--device", "cpu", "--tokens", "200", "--layers", "2", "--heads", "2", "--head-dim", "64", "--repeats", "2",
             "--chunk-bytes", "4096", "--json", str(out))  # fmt: skip
    result = run("gpu_check_decode_upgrade.py", *small)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["device"] == "cpu (dry run)" and set(report["presets"]) == {"int8", "bf16-exact"}
    for preset in report["presets"].values():
        assert preset["anchor_exact"] and preset["upgrade_exact"] and preset["untouched"] and not preset["failures"]
        assert preset["control_stages_differ"], "the anchor alone must decode to other values than every stream"


@pytest.mark.slow
def test_the_script_running_every_gpu_check_says_it_checked_nothing_without_a_gpu(tmp_path):
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHON": sys.executable}
    result = subprocess.run([str(ROOT / "scripts" / "gpu_checks.sh"), str(tmp_path)], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=120)  # fmt: skip
    assert result.returncode == 2 and "no CUDA GPU visible; nothing checked" in result.stderr
    assert not list(tmp_path.iterdir())
