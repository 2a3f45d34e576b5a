"""The docs' codec tables render from small JSON documents of the shape their scripts write."""

from __future__ import annotations

import pytest
from benchmark_modules import load


@pytest.fixture(scope="module")
def reports():
    return load("codec_bytes", "codec_report", "codec_speed_report")


def quality_row(spec, stages, num_stages, bytes_per_token, err, agreement, gaps, **design):
    return {"spec": spec, "stages": stages, "num_stages": num_stages, "bytes_per_token": bytes_per_token,
            "of_bf16": bytes_per_token / 23040, "attn_err_mean": err, "attn_err_max": 2 * err,
            "agreement": agreement, "parted": len(gaps), "parted_near_tie": sum(g < 0.1 for g in gaps),
            "parted_gaps": gaps, **design}  # fmt: skip


QUALITY = {
    "config": {"date": "2026-12-07", "model": "SmolLM2-135M-Instruct", "num_prompts": 2, "prompt_tokens": 160,
               "prompt_essay_indices": [0, 24], "prefix_tokens": 128, "queries": 8, "query_heads": 9, "kv_heads": 3,
               "continuation": 32, "near_tie_positions": 5, "near_tie_nats": 0.1},
    "results": [
        quality_row("int8", 1, 2, 6515.25, 0.0969, 0.9375, [0.251, 0.002, 0.05, 0.3]),
        quality_row("bf16-exact", 2, 2, 29507.2, 0.0, 1.0, []),
        quality_row("2+2+4", 3, 3, 12263.2, 0.006945, 0.96875, [0.002, 0.003]),
        quality_row("plain 4-bit, no sinks", 1, 1, 6480.0, 0.1, 0.9, [0.01] * 6, study="anchor", simulated=False,
                    role="baseline"),
        quality_row("log grid (dense ends, mu 3)", 1, 1, 6480.0, 0.15, 0.8, [0.2] * 6, study="anchor",
                    simulated=True, role=""),
        quality_row("4 sink tokens", 1, 1, 6515.2, 0.0969, 0.95, [0.05] * 3, study="anchor", simulated=False,
                    role="adopted"),
        quality_row("16 centred sub-cells of every anchor cell", 2, 2, 12240.0, 0.009874, 0.9, [0.01],
                    study="residual", simulated=True, role=""),
        quality_row("end cells (the `int8` preset)", 2, 2, 12263.2, 0.005887, 0.9, [0.01], study="residual",
                    simulated=False, role="adopted"),
    ],
}  # fmt: skip


def test_quality_table_lists_the_specs_with_their_gaps_and_skips_the_designs(reports):
    _, report, _ = reports
    text = report.quality_markdown(QUALITY)
    assert "2 essay excerpts of 160 tokens (essays 0 and 24), 128 prefilled;" in text
    assert "32 tokens teacher-forced: 64 positions (one is 0.016 of agreement), 5 near ties on the BF16 cache." in text
    rows = [line for line in text.splitlines() if line.startswith("| ") and "---" not in line][1:]
    assert rows == [
        "| `int8` | 1/2 | 6,515.2 | 0.2828 | 9.690e-02 | 1.938e-01 | 0.9375 | 4 (2) | 0.002–0.300 |",
        "| `bf16-exact` | 2/2 | 29,507.2 | 1.2807 | 0 | 0 | 1.0000 | 0 (0) | — |",
        "| 2+2+4 | 3/3 | 12,263.2 | 0.5323 | 6.945e-03 | 1.389e-02 | 0.9688 | 2 (2) | 0.002 and 0.003 |",
    ]


def test_anchor_table_gives_changes_against_the_baseline_and_marks_simulated_and_adopted(reports):
    _, report, _ = reports
    lines = report.anchor_markdown(QUALITY).splitlines()
    assert lines[2] == "| plain 4-bit, no sinks | 6,480.0 | — | 1.000e-01 | 2.000e-01 | 0.9000 | 6 (6) |"
    assert lines[3] == ("| log grid (dense ends, mu 3; simulated) | 6,480.0 | +0.00 % | 1.500e-01 (+50.0 %) | "
                        "3.000e-01 | 0.8000 | 6 (0) |")  # fmt: skip
    assert lines[4] == ("| **4 sink tokens (adopted)** | 6,515.2 | +0.54 % | 9.690e-02 (−3.1 %) | 1.938e-01 | "
                        "0.9500 | 3 (3) |")  # fmt: skip
    assert len(lines) == 5


def test_residual_table_holds_only_the_residual_study(reports):
    _, report, _ = reports
    assert report.residual_markdown(QUALITY).splitlines()[2:] == [
        "| 16 centred sub-cells of every anchor cell (simulated) | 12,240.0 | 9.874e-03 | 1.975e-02 | 0.9000 | 1 (1) |",
        "| **end cells (the `int8` preset; adopted)** | 12,263.2 | 5.887e-03 | 1.177e-02 | 0.9000 | 1 (1) |"]


def test_bytes_tables_match_the_codecs_accounting_for_smollm2(reports, tmp_path):
    codec_bytes, report, _ = reports
    out = tmp_path / "bytes.json"
    assert codec_bytes.main(["--shapes", "SmolLM2=30x3x64", "--tokens", "1920", "--json", str(out)]) == 0
    import json

    text = report.bytes_markdown(json.loads(out.read_text()))
    assert "**SmolLM2** (3 KV heads × 64, 30 layers; BF16: 768 B per layer, 23,040 B in all):" in text
    assert ("| `int8` | 6,480 (0.281) | 5,760 (0.250) | 12,240 (0.531) | "
            "anchor +66,240 B, residual −23,040 B |") in text
    assert "| `int4` | 6,480 (0.281) | — | 6,480 (0.281) | anchor +66,240 B |" in text
    assert ("| 2+2+4 | 3,600 (0.156) | 2,880 + 5,760 (0.125 + 0.250) | 12,240 (0.531) | "
            "anchor +77,760 B, residuals −11,520 and −23,040 B |") in text  # fmt: skip
    assert text.rstrip().endswith(
        "(sink tokens included): 1,920 tokens anchor 6,515.2 B (0.2828), residual 5,748.0 B (0.2495).")


def throughput_row(op, preset, median_s, gb_per_s, vs_copy):
    return {"op": op, "preset": preset, "backend": "reference", "median_s": median_s, "gb_per_s": gb_per_s,
            "vs_copy": vs_copy}


THROUGHPUT = {
    "config": {"date": "2026-12-07", "processor": "Some CPU", "threads": 1, "repeats": 5, "warmup": 1,
               "load_average": [0.31, 0.52]},
    "shapes": [{"tokens": 4096, "kv_heads": 3, "head_dim": 64, "bf16_bytes": 3 << 20, "rows": [
        throughput_row("copy (clone)", "-", 0.0001, 31.4, 1.0),
        throughput_row("gather pool[slots]", "-", 0.001, 3.14, 0.1),
        throughput_row("encode", "int8", 0.0255, 0.123, 0.0039),
        throughput_row("decode 1/2", "int8", 0.0049, 0.642, 0.0204),
        throughput_row("decode 2/2", "int8", 0.0112, 0.281, 0.0089),
        throughput_row("encode", "int4", 0.012, 0.262, 0.0083),
        throughput_row("decode 1/1", "int4", 0.0046, 0.684, 0.0218),
        throughput_row("scatter_decode 1/1", "int4", 0.0051, 0.617, 0.0196),
    ]}],
}  # fmt: skip


def test_throughput_table_puts_one_stream_decodes_under_anchor_only(reports):
    _, _, speed = reports
    lines = speed.throughput_markdown(THROUGHPUT).splitlines()
    assert lines[0] == ("2026-12-07, Some CPU, 1 torch thread, load average 0.3 before and 0.5 after; "
                        "median of 5 runs after 1 warm-up run.")  # fmt: skip
    assert lines[2] == "4,096 tokens × 3 KV heads × 64 (3 MiB of BF16 K+V):"
    assert lines[4:10] == [
        "| op | `int8` GB/s (vs copy) | `int4` |",
        "| --- | --- | --- |",
        "| encode | 0.123 (0.0039) | 0.262 (0.0083) |",
        "| decode, anchor only | 0.642 (0.0204) | 0.684 (0.0218) |",
        "| decode, all streams | 0.281 (0.0089) | — |",
        "| `scatter_decode`, anchor only | — | 0.617 (0.0196) |",
    ]
    assert lines[-1] == "Baselines in the same run: copy 31.4 GB/s, gather `pool[slots]` 3.14 GB/s."


def test_throughput_ms_table_gives_median_milliseconds_per_shape_and_preset(reports):
    _, _, speed = reports
    lines = speed.throughput_ms_markdown(THROUGHPUT).splitlines()
    assert lines[0] == "| median ms | 4096×3×64 `int8` | `int4` |"
    assert lines[2:4] == ["| encode | 25.5 | 12 |", "| decode, anchor only | 4.9 | 4.6 |"]
    assert lines[-1] == "Baselines in the same run, ms: 4096×3×64: copy 0.1, gather `pool[slots]` 1."


def gpu_row(preset, op, path, gb, copy=1855.0, other=1536.0):
    return {"preset": preset, "op": op, "path": path, "GB/s": gb, "copy GB/s": copy, "vs copy": gb / copy,
            "gather/scatter GB/s": other if op == "encode" else 624.0}


GPU = {"device": "NVIDIA H200", "repeats": 20, "shape": {"tokens": 32768, "kv_heads": 8, "head_dim": 128},
       "bandwidth": [gpu_row(p, op, path, gb) for p, scale in (("int8", 1.0), ("int4", 2.0))
                     for op, path, gb in (("encode", "kernel", 96.4 * scale), ("encode", "api", 89.0 * scale),
                                          ("decode anchor", "kernel", 287.0), ("decode all", "kernel", 178.0))]}  # fmt: skip


def test_gpu_bandwidth_table_and_sentence(reports):
    _, _, speed = reports
    lines = speed.gpu_bandwidth_markdown(GPU).splitlines()
    assert lines[0] == "| 32,768 tokens (128 MiB of K+V) | `int8` | `int4` |"
    assert lines[2:6] == ["| encode, kernel | 96 (0.052) | 193 (0.104) |", "| encode, api | 89 | 178 |",
                          "| decode anchor only, kernel | 287 (0.155) | 287 (0.155) |",
                          "| decode all streams, kernel | 178 (0.096) | 178 (0.096) |"]  # fmt: skip
    assert lines[-1] == ("NVIDIA H200, medians of 20 CUDA-event timings; in parentheses the fraction of a device copy "
                         "of the same bytes in the same run (1,855 GB/s; index gather of the pool rows 1,536, "
                         "scatter 624).")
    assert speed.gpu_bandwidth_sentence(GPU) == (
        "32,768 tokens (128 MiB), kernel GB/s: `int8` encode 96, anchor decode 287, full decode 178; "
        "`int4` 193, 287, 178; copy 1,855, gather 1,536, scatter 624.\n")
