"""The demo (README command 1) prints its chat completion's own Lynx metrics and writes nothing into the checkout."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.server
def test_demo_prints_the_metrics_of_its_own_chat_completion_and_logs_outside_the_checkout():
    env = {**os.environ, "OMP_NUM_THREADS": "1", "SGLANG_HOST_IP": "127.0.0.1"}
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "demo_chat.py"), "--max-tokens", "16"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=900,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert re.search(r"^A: .*Paris", result.stdout, re.MULTILINE), result.stdout
    metrics = json.loads(re.search(r"metrics of this chat completion: (\{.*\})$", result.stdout, re.MULTILINE)[1])
    assert metrics["mode"] == "lynx" and 0 < metrics["anchor_ready_s"] <= metrics["residual_ready_s"]
    assert metrics["transferred_tokens"] > 0
    log_dir = Path(re.search(r"logs in (\S+)$", result.stdout, re.MULTILINE)[1]).resolve()
    assert (log_dir / "decode.log").exists()
    inside = log_dir.is_relative_to(ROOT)
    ignored = inside and subprocess.run(["git", "check-ignore", "-q", str(log_dir)], cwd=ROOT).returncode == 0
    assert not inside or ignored, f"the demo's logs ({log_dir}) would show in git status"
