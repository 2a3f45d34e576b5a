import json
import math
import subprocess
import sys

import pytest
import torch

from lynx.codec import CodecSpec
from lynx_deploy.estimate import (
    COMPUTE_SHAPES,
    GEOMETRIES,
    MODES,
    KVGeometry,
    Scenario,
    chunk_units,
    estimate,
    main,
    overlapped_s,
    prefill_tok_s_from_flops,
    sequential_s,
)

LLAMA_8B = GEOMETRIES["llama-3.1-8b"]
GIB = 2**30


def _at(tokens=32768, gbps=10.0, prefill=32768.0, **kwargs):
    return {mode: estimate(LLAMA_8B, Scenario(tokens, gbps, prefill, **kwargs), mode) for mode in MODES}


def test_presets_hold_the_published_kv_geometries():
    assert [(g.num_layers, g.kv_heads, g.head_dim) for g in map(GEOMETRIES.get, (
        "llama-3.1-8b", "llama-3.1-70b", "smollm2-135m"))] == [(32, 8, 128), (80, 8, 128), (30, 3, 64)]  # fmt: skip
    assert LLAMA_8B.raw_bytes(1) == 128 * 1024  # 128 KiB of bf16 KV per token


def test_bf16_llama_8b_at_32k_tokens_on_10_gbps_is_4_gib_in_3_44_s():
    bf16 = _at()["bf16"]
    assert bf16.critical_bytes == bf16.total_bytes == 4 * GIB
    assert bf16.transfer_s == pytest.approx(3.4359738368, rel=1e-12)
    assert bf16.prefill_s == 1.0
    assert bf16.ttft_sequential_s == pytest.approx(4.4359738368, rel=1e-12)
    # 32 layer pipeline: 3.436 * 31/32 + (1 + 3.436) / 32
    assert bf16.ttft_overlapped_s == pytest.approx(3.4672238368, rel=1e-12)


def test_flow_shop_formula_by_hand():
    assert overlapped_s((2.0, 1.0, 4.0, 0.0), units=4, step_s=0.5) == 5.25
    assert overlapped_s((2.0, 1.0, 4.0), units=1, step_s=0.0) == sequential_s((2.0, 1.0, 4.0), 0.0) == 7.0


def test_overlap_tends_to_the_slower_of_prefill_and_transfer():
    fine = estimate(LLAMA_8B, Scenario(32768, 10.0, 32768.0, pipeline_units=10**6), "bf16")
    assert fine.ttft_overlapped_s == pytest.approx(max(fine.prefill_s, fine.transfer_s), rel=1e-5)


def test_anchor_bytes_per_token_of_llama_8b_by_hand():
    # Per layer and token, 8 heads x 128 channels, K and V: 4-bit codes 1024 B;
    # key min+scale (fp16) per channel per 64 tokens 64 B; value min+scale per
    # token per 64 channels 64 B. 1152 B x 32 layers.
    rows = _at()
    assert rows["int4"].stream_bytes_per_token == (36864.0,)
    assert rows["lynx"].stream_bytes_per_token == (36864.0, 32768.0)
    assert rows["int8"].stream_bytes_per_token == (32 * (2048 + 128.0),)
    assert rows["bf16"].stream_bytes_per_token == (131072.0,)


def test_critical_bytes_come_from_the_codec_streams():
    rows = _at(tokens=10_000)
    spec = CodecSpec.preset("int8")
    streams = spec.stream_bytes(10_000, 8, 128, torch.bfloat16)
    assert rows["lynx"].critical_bytes == 32 * streams[0]
    assert rows["lynx"].total_bytes == 32 * sum(streams)
    assert rows["int4"].critical_bytes == rows["lynx"].critical_bytes
    assert rows["int8"].critical_bytes == rows["int8"].total_bytes
    assert rows["lynx"].critical_bytes == pytest.approx(10_000 * 36864, rel=2e-3)


def test_lynx_waits_like_int4_and_its_residual_lands_when_int8_would_start():
    rows = _at(prefill=1e9)  # transfer-bound
    assert rows["lynx"].ttft_sequential_s == rows["int4"].ttft_sequential_s
    assert rows["int4"].ttft_overlapped_s < rows["int8"].ttft_overlapped_s < rows["bf16"].ttft_overlapped_s
    assert rows["lynx"].all_streams_overlapped_s == pytest.approx(rows["int8"].ttft_overlapped_s, rel=1e-9)
    # Against int8, lynx's transfer is shorter by the residual's share (~ 32768 / 69632).
    ratio = rows["lynx"].transfer_s / rows["int8"].transfer_s
    assert ratio == pytest.approx(36864 / 69632, rel=2e-3)


def test_codec_time_counts_for_codec_modes_only():
    free, costly = _at(), _at(encode_gbps=1.0, decode_gbps=2.0, decode_step_s=0.01)
    raw = 4 * GIB
    assert costly["bf16"].ttft_sequential_s == pytest.approx(free["bf16"].ttft_sequential_s + 0.01)
    assert costly["int8"].encode_s == pytest.approx(raw / 1e9)
    assert costly["int8"].decode_s == pytest.approx(raw / 2e9)
    expected = free["int8"].ttft_sequential_s + raw / 1e9 + raw / 2e9 + 0.01
    assert costly["int8"].ttft_sequential_s == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize(
    "kwargs",
    [dict(tokens=0), dict(link_gbps=0.0), dict(prefill_tok_s=-1.0), dict(encode_gbps=math.nan),
     dict(decode_step_s=-0.1), dict(pipeline_units=0), dict(tokens=1.5)],
)  # fmt: skip
def test_invalid_scenarios_are_refused(kwargs):
    with pytest.raises(ValueError):
        Scenario(**{**dict(tokens=1024, link_gbps=10.0, prefill_tok_s=1000.0), **kwargs})


def test_invalid_geometry_and_mode_are_refused():
    with pytest.raises(ValueError):
        KVGeometry("x", 0, 8, 128)
    with pytest.raises(ValueError):
        KVGeometry("x", 32, 8, 128, dtype="int8")
    with pytest.raises(ValueError):
        estimate(LLAMA_8B, Scenario(1024, 10.0, 1000.0), "fp8")


def test_command_prints_a_table_labelled_estimate(capsys):
    assert main(["--tokens", "32768", "--gbps", "10,100", "--prefill-tok-s", "32768"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("ESTIMATE")
    rows = [line for line in out.splitlines() if line.lstrip().startswith("32768")]
    assert len(rows) == 2 * len(MODES)
    assert "3.4672" in rows[0] and "4.4360" in rows[0]


def test_command_json_is_labelled_estimate_and_matches_the_function(capsys):
    assert main(["--model", "llama-3.1-70b", "--tokens", "8192", "--gbps", "25", "--prefill-tok-s", "5000",
                 "--decode-step-ms", "20", "--json"]) == 0  # fmt: skip
    data = json.loads(capsys.readouterr().out)
    assert data["kind"] == "estimate" and all(row["kind"] == "estimate" for row in data["rows"])
    expected = estimate(GEOMETRIES["llama-3.1-70b"], Scenario(8192, 25.0, 5000.0, decode_step_s=0.02), "lynx")
    (lynx,) = [row for row in data["rows"] if row["mode"] == "lynx"]
    assert lynx["ttft_overlapped_s"] == expected.ttft_overlapped_s
    assert lynx["critical_bytes"] == expected.critical_bytes


def test_command_rejects_bad_values_with_status_2(capsys):
    assert main(["--tokens", "1024", "--gbps", "0", "--prefill-tok-s", "100"]) == 2
    assert "error" in capsys.readouterr().err


@pytest.mark.slow
def test_estimator_does_not_import_sglang():
    code = "import sys, lynx_deploy.estimate; print('sglang' in sys.modules, 'triton' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


def test_compute_bound_prefill_rate_by_hand():
    # 8B at 32k tokens: 2 * 8.03e9 + 2 * 32 * 4096 * 32768 FLOPs per token at 400 TFLOP/s.
    params, d_model = COMPUTE_SHAPES["llama-3.1-8b"]
    per_token = 2 * 8.03e9 + 2 * 32 * 4096 * 32768
    assert prefill_tok_s_from_flops(params, d_model, 32, 32768, 400.0) == pytest.approx(400e12 / per_token)
    short = prefill_tok_s_from_flops(params, d_model, 32, 1024, 400.0)
    assert short > prefill_tok_s_from_flops(params, d_model, 32, 131072, 400.0)
    with pytest.raises(ValueError):
        prefill_tok_s_from_flops(params, d_model, 32, 1024, 0.0)


def test_a_chunked_prefill_pipelines_one_unit_per_chunk():
    assert [chunk_units(t, 512) for t in (1, 300, 512, 1025, 1300, 2048)] == [1, 1, 1, 2, 3, 4]
    assert chunk_units(32768, 8192) == 4
    with pytest.raises(ValueError):
        chunk_units(1024, 0)


def test_command_takes_a_compute_rate_and_chunked_units(capsys):
    argv = ["--tokens", "32768", "--gbps", "10", "--prefill-tflops", "400", "--chunk-tokens", "8192", "--json"]
    assert main(argv) == 0
    data = json.loads(capsys.readouterr().out)
    params, d_model = COMPUTE_SHAPES["llama-3.1-8b"]
    rate = prefill_tok_s_from_flops(params, d_model, 32, 32768, 400.0)
    expected = estimate(LLAMA_8B, Scenario(32768, 10.0, rate, pipeline_units=4), "int8")
    (int8,) = [row for row in data["rows"] if row["mode"] == "int8"]
    assert int8["ttft_overlapped_s"] == pytest.approx(expected.ttft_overlapped_s, rel=1e-12)
    assert data["prefill_tflops"] == 400.0 and data["chunk_tokens"] == 8192


def test_command_needs_exactly_one_prefill_rate(capsys):
    with pytest.raises(SystemExit):
        main(["--tokens", "1024"])
    with pytest.raises(SystemExit):
        main(["--tokens", "1024", "--prefill-tflops", "400", "--prefill-tok-s", "5"])
