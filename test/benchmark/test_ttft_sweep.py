"""The TTFT sweep runs end to end on a real PD pair (smallest configuration) and writes its JSON."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.server

BENCHMARK = Path(__file__).resolve().parents[2] / "benchmark"


def test_lynx_point_reports_ttft_nth_tokens_arrivals_and_acceptance(tmp_path, model_path):
    out = tmp_path / "sweep.json"
    command = [
        sys.executable, str(BENCHMARK / "ttft_sweep.py"), "--modes", "lynx", "--link-gbps", "0.01",
        "--prompt-tokens", "512", "--repeats", "1", "--max-tokens", "8", "--nth", "1,8",
        "--json", str(out), "--log-dir", str(tmp_path / "logs"),
    ]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=900, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "TTFT s" in result.stdout and "accept" in result.stdout
    (row,) = json.loads(out.read_text())["rows"]
    assert row["mode"] == "lynx" and row["prompt_tokens"] > 512
    assert 0 < row["ttft_s"] <= row["t8_s"]
    assert 0 < row["anchor_ready_s"] <= row["residual_ready_s"]
    assert len(row["stream_bytes"]) == 2 and row["stream_bytes"][0] > 0
    assert row["speculative_tokens"] > 0 and 0 <= row["accepted_tokens"] <= row["speculative_tokens"]
