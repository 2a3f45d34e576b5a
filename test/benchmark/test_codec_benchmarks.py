"""The codec benchmark scripts still run: --help, and their smallest real configurations."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

BENCHMARK = Path(__file__).resolve().parents[2] / "benchmark"


def run_script(name: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(BENCHMARK / name), *args], capture_output=True, text=True,
                          timeout=300, check=False)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["codec_throughput.py", "codec_quality.py"])
def test_help_describes_the_json_option(name):
    result = run_script(name, "--help")
    assert result.returncode == 0, result.stderr
    assert "--json" in result.stdout


@pytest.mark.slow
def test_throughput_tiny_run_reports_positive_rates_for_every_preset(tmp_path):
    out = tmp_path / "throughput.json"
    result = run_script("codec_throughput.py", "--shapes", "128x2x64", "--repeats", "1", "--warmup", "0",
                        "--json", str(out))
    assert result.returncode == 0, result.stderr
    report = json.loads(out.read_text())
    assert report["config"]["threads"] >= 1
    [shape] = report["shapes"]
    assert (shape["tokens"], shape["kv_heads"], shape["head_dim"]) == (128, 2, 64)
    rows = shape["rows"]
    assert rows[0]["op"] == "copy (clone)" and rows[0]["vs_copy"] == 1.0
    for preset in ("int8", "int16", "int4", "bf16-exact"):
        ops = {row["op"] for row in rows if row["preset"] == preset}
        assert {"encode", "gather_encode"} <= ops
        assert any(op.startswith("decode 1/") for op in ops) and any(op.startswith("scatter_decode") for op in ops)
    assert all(row["gb_per_s"] > 0 and row["median_s"] > 0 for row in rows)
    assert "GB/s" in result.stdout


@pytest.mark.slow
def test_quality_tiny_run_checks_bytes_and_bf16_exactness(tmp_path, model_path):
    out = tmp_path / "quality.json"
    result = run_script("codec_quality.py", "--num-prompts", "1", "--prompt-tokens", "160", "--continuation", "32",
                        "--queries", "8", "--json", str(out))
    assert result.returncode == 0, result.stderr
    report = json.loads(out.read_text())
    assert report["config"]["prefix_tokens"] == 128
    rows = {(row["spec"], row["stages"]): row for row in report["results"]}
    assert {("int8", 2), ("int16", 2), ("int4", 1), ("bf16-exact", 2), ("2+2+4", 3)} <= rows.keys()
    for row in rows.values():
        assert row["measured_stream_bytes_per_token"] == row["stream_bytes_per_token"]
        assert 0 <= row["agreement"] <= 1 and row["attn_err_mean"] >= 0
        assert row["parted"] == round((1 - row["agreement"]) * 32) == len(row["parted_gaps"])
        assert row["parted_near_tie"] == sum(gap < report["config"]["near_tie_nats"] for gap in row["parted_gaps"])
        assert all(gap >= 0 for gap in row["parted_gaps"])
    assert 0 <= report["config"]["near_tie_positions"] <= 32
    exact = rows[("bf16-exact", 2)]
    assert exact["agreement"] == 1.0 and exact["attn_err_max"] == 0.0
    for split in (("int8", 1), ("int16", 1), ("bf16-exact", 1)):
        assert {key: rows[split][key] for key in ("bytes_per_token", "attn_err_per_layer", "agreement")} == {
            key: rows[("int4", 1)][key] for key in ("bytes_per_token", "attn_err_per_layer", "agreement")}
    assert rows[("2+2+4", 1)]["attn_err_mean"] > rows[("2+2+4", 2)]["attn_err_mean"] > rows[("2+2+4", 3)]["attn_err_mean"]


def test_every_candidate_design_decodes_a_layer_to_its_shape_and_near_the_input():
    sys.path.insert(0, str(BENCHMARK))
    try:
        from anchor_candidates import candidates
    finally:
        sys.path.remove(str(BENCHMARK))
    generator = torch.Generator().manual_seed(0)
    key = (torch.randn(150, 2, 64, generator=generator) * torch.linspace(0.1, 8, 64)).bfloat16()
    value = torch.randn(150, 2, 64, generator=generator).bfloat16()
    designs = candidates()
    assert len({design.name for design in designs}) == len(designs)
    for design in designs:
        k, v = design.decode(key, value)
        assert k.shape == key.shape and v.dtype == value.dtype, design.name
        bound = 0.2 if design.study == "anchor" else 0.02
        for got, want in ((k, key), (v, value)):
            assert float((got.float() - want.float()).norm() / want.float().norm()) < bound, design.name
        assert design.extra_bytes(150, 2, 64) >= 0
