"""The docs' TTFT and transport tables render from JSON built by the benchmarks' own row functions."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

BENCHMARK = Path(__file__).resolve().parents[2] / "benchmark"
if str(BENCHMARK) not in sys.path:
    sys.path.insert(0, str(BENCHMARK))

MIB = 1 << 20


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, BENCHMARK / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def sweep():
    return _load("ttft_sweep")


@pytest.fixture(scope="module")
def tables():
    return _load("ttft_tables")


def _runs(*times: dict, **common) -> list[dict]:
    """Runs as `ttft_outputs.stream_recorded` records them, for a 1,072-token prompt."""
    return [{"prompt_tokens": 1072, "completion_tokens": 32, "text": f"answer {i}", "request": [1024, i],
             **common, **t} for i, t in enumerate(times)]  # fmt: skip


def _written(sweep, tmp_path, rows: list[dict]) -> dict:
    """`rows` through the sweep's own `write_json` (which adds BF16 transfer / prefill), read back."""
    args = sweep.parse_args(["--json", str(tmp_path / "sweep.json")])
    sweep.write_json(args, rows)
    return json.loads((tmp_path / "sweep.json").read_text())


def _row(sweep, mode: str, rate: float, kind: str, prefill_s: float, runs: list[dict], segment=512, transport="zmq",
         group=None) -> dict:
    """A row as `ttft_sweep.sweep_points` appends it: `summarize` and the deployment's point."""
    point = {"segment_tokens": segment, "transport": transport, "chunk_bytes": sweep.chunk_bytes(rate, 10.0),
             "group": group}  # fmt: skip
    return sweep.summarize(mode, rate, 1024, kind, prefill_s, runs) | point


def _lynx(t1: float, upgrade: float, forward: float, drafted=16, accepted=16) -> dict:
    return {"t1_s": t1, "t8_s": t1 + 2.5, "t32_s": t1 + 4.5, "anchor_ready_s": t1 - 0.02,
            "residual_ready_s": t1 + 2.4, "speculative_tokens": drafted, "accepted_tokens": accepted,
            "rollbacks": int(accepted < drafted), "upgrade_s": upgrade, "forward_s": forward, "predict_s": 0.001,
            "commit_s": 0.0}  # fmt: skip


def _int8(t1: float) -> dict:
    """A run of a one-stream mode (the decode reports a `residual_ready_s` for it too)."""
    return {"t1_s": t1, "t8_s": t1 + 0.6, "t32_s": t1 + 2.7, "anchor_ready_s": t1 - 0.02, "residual_ready_s": t1 - 0.02}


def test_the_transports_table_gives_each_mode_on_each_transport_its_medians(sweep, tables, tmp_path):
    rows = []
    for transport, (prefill, shift) in {"zmq": (5.0, 0.0), "mooncake": (7.0, 0.5)}.items():
        int8 = _runs(_int8(9.28 + shift), _int8(9.1 + shift), _int8(9.5 + shift))
        lynx = _runs(_lynx(7.43 + shift, 0.2, 0.1), _lynx(7.0 + shift, 0.2, 0.1),
                     _lynx(7.6 + shift, 0.2, 0.1, accepted=13))  # fmt: skip
        rows.append(_row(sweep, "int8", 0.02, "greedy", prefill, int8, transport=transport))
        rows.append(_row(sweep, "lynx", 0.02, "greedy", prefill, lynx, transport=transport))
    document = _written(sweep, tmp_path, rows)
    lead, blank, header, rule, *lines = tables.transports_markdown(document).splitlines()
    assert lead == (f"{document['date']}, commit {document['commit']}; 1,072-token prompts; BF16 transfer / prefill "
                    "1.4-2.0; calibrated prefill 5.0-7.0 s; medians of 3 repeats, seconds:")  # fmt: skip
    assert header == "| mode | transport | t1 | t8 | t32 | anchor landed | residual landed | accepted |"
    assert rule.count("---") == 8
    assert lines == [
        "| `int8` | `zmq` | 9.28 | 9.88 | 11.98 | 9.26 | — | — |",
        "| `lynx` | `zmq` | 7.43 | 9.93 | 11.93 | 7.41 | 9.83 | 0.94 (45 of 48) |",
        "| `int8` | `mooncake` | 9.78 | 10.38 | 12.48 | 9.76 | — | — |",
        "| `lynx` | `mooncake` | 7.93 | 10.43 | 12.43 | 7.91 | 10.33 | 0.94 (45 of 48) |",
    ]


def test_the_transports_table_adds_a_column_for_each_setting_that_varies(tables):
    row = {"mode": "lynx", "link_gbps": 0.02, "prompt_tokens": 1072, "request_type": "greedy", "segment_tokens": 512,
           "transport": "zmq", "t1_s": 7.0, "repeats": 1, "speculative_tokens": 0, "runs": []}  # fmt: skip
    text = tables.transports_markdown({"rows": [row, row | {"link_gbps": 0.1, "t1_s": 5.0}]})
    header, _, first, second = text.splitlines()[2:]
    assert header == "| mode | transport | Gbit/s | t1 | anchor landed | residual landed | accepted |"
    assert first == "| `lynx` | `zmq` | 0.02 | 7.00 | — | — | none drafted |"
    assert second.startswith("| `lynx` | `zmq` | 0.1 | 5.00 |")
    assert text.startswith("1,072-token prompts; medians of 1 repeats, seconds:"), "no date: an undated document"


def test_the_pipelining_table_sets_each_segmented_row_against_its_twin_sent_whole(sweep, tables, tmp_path):
    rows = []
    for mode, (pipelined, whole) in {"int8": (23.75, 42.77), "lynx": (12.97, 26.6)}.items():
        for segment, t1, prefill in ((512, pipelined, 12.4), (0, whole, 22.7)):
            runs = _runs({"t1_s": t1 - 0.5}, {"t1_s": t1}, {"t1_s": t1 + 0.5})
            rows.append(_row(sweep, mode, 0.0045, "greedy", prefill, runs, segment=segment))
    document = _written(sweep, tmp_path, rows)
    lead, _, header, _, int8, lynx = tables.pipelining_markdown(document).splitlines()
    assert lead.endswith("; 1,072-token prompts; calibrated prefill 12.4-22.7 s; medians of 3 repeats, seconds:")
    assert header == "| mode | BF16 transfer / prefill | pipelined t1 | whole t1 | pipelined / whole |"
    assert int8 == "| `int8` | 1.9-3.5 | 23.75 | 42.77 | 0.555 |"
    assert lynx == "| `lynx` | 1.9-3.5 | 12.97 | 26.60 | 0.488 |"
    (entry,) = [p for p in document["pipelining"] if p["mode"] == "lynx"]
    assert f"{entry['t1_on_over_off']:.3f}" == "0.488", "the ratio the sweep itself records"


def test_the_verify_table_pools_the_lynx_runs_of_a_point_and_takes_stage_medians(sweep, tables, tmp_path):
    beside_int4 = _runs(_lynx(4.7, 0.02, 0.19), _lynx(4.8, 0.03, 0.20), _lynx(4.9, 0.28, 0.27, accepted=10))
    beside_int8 = _runs(_lynx(4.7, 0.19, 0.18), _lynx(4.7, 0.04, 0.22), _lynx(4.8, 0.06, 0.24))
    fast = _runs(_lynx(4.0, 0.5, 0.6, drafted=0, accepted=0))
    rows = [
        _row(sweep, "lynx", 0.012, "greedy", 2.4, beside_int4, group=1),
        _row(sweep, "int4", 0.012, "greedy", 2.3, _runs({"t1_s": 4.7}), group=1),
        _row(sweep, "lynx", 0.012, "greedy", 2.0, beside_int8, group=2),
        _row(sweep, "int8", 0.012, "greedy", 2.1, _runs({"t1_s": 8.9}), group=2),
        _row(sweep, "lynx", 0.1, "json", 2.4, fast),
    ]
    document = _written(sweep, tmp_path, rows)
    lead, _, header, _, slow_link, fast_link = tables.verify_markdown(document).splitlines()
    assert lead.endswith("; 1,072-token prompts; calibrated prefill 2.0-2.4 s; medians of 1-3 repeats, seconds:")
    assert header == ("| Gbit/s | type | xfer/prefill | requests | drafted (accepted) | `upgrade_s` | `forward_s` "
                      "| `predict_s` | `commit_s` |")  # fmt: skip
    # Six requests: upgrade 0.02 0.03 0.28 0.19 0.04 0.06 -> 0.05; forward 0.19 0.20 0.27 0.18 0.22 0.24 -> 0.21.
    assert slow_link == "| 0.012 | greedy | 6.9-8.2 | 6 | 96 (90) | 0.050 | 0.210 | 0.001 | 0.000 |"
    assert fast_link == "| 0.1 | json | 0.8 | 1 | 0 (0) | 0.500 | 0.600 | 0.001 | 0.000 |"


def test_stage_medians_over_one_row_are_the_rows_own_and_name_every_verify_stage(sweep, tables):
    runs = _runs(_lynx(4.7, 0.02, 0.19), _lynx(4.8, 0.31, 0.2), _lynx(4.9, 0.28, 0.27))
    row = sweep.summarize("lynx", 0.02, 1024, "greedy", 2.4, runs)
    assert tables.STAGES == sweep.VERIFY_STAGES
    assert tables.stage_medians([row]) == {stage: row[stage] for stage in sweep.VERIFY_STAGES}
    assert tables.stage_medians([sweep.summarize("int8", 0.02, 1024, "greedy", 2.4, _runs(_int8(9.0)))]) is None


@pytest.fixture(scope="module")
def transports():
    return _load("transport_compare"), _load("transport_report")


COSTS = {"blake2b_s_per_gb": 1.07, "memcpy_warm_s_per_gb": 0.0231, "copy_out_bytes_s_per_gb": 0.31,
         "copy_first_touch_s_per_gb": 2.2}  # fmt: skip
BASE_GBPS = {"zmq": 5.0, "zmq-curve": 4.0, "zmq-zc": 5.5, "mooncake": 6.0, "mooncake-view": 7.0, "mooncake-engine": 8.0}


def _samples(gbps: float, sender: float, receiver: float) -> list[dict]:
    """Three samples as `Peer.run` returns them; their medians are the arguments."""
    return [{"gbps": gbps * f, "sender_cpu_s_per_gb": sender * f, "receiver_cpu_s_per_gb": receiver * f}
            for f in (0.5, 1.0, 3.0)]  # fmt: skip


def _transport_document(compare) -> dict:
    variants, sizes, chunks, modes = list(BASE_GBPS), [16 * MIB, 64 * MIB], [MIB, 4 * MIB], ["raw", "frames"]
    rates = [1.0, 4.0]
    unpaced = {}
    for size in sizes:
        for chunk in chunks:
            for mode in modes:
                for variant in variants:
                    if mode == "frames" and variant == "mooncake-engine":
                        continue
                    scale = (2 if chunk == 4 * MIB else 1) * (0.5 if mode == "frames" else 1) * size / (16 * MIB)
                    mooncake = 1.5 if variant == "mooncake" and chunk == MIB else 1.0
                    cpu = 0.1 * (1 + variants.index(variant)) * (1 if size == 16 * MIB else 2)
                    unpaced[(variant, size, chunk, mode)] = _samples(BASE_GBPS[variant] * scale * mooncake, cpu,
                                                                     cpu * (5 if mode == "frames" else 1))
    paced = {(v, rate): _samples(rate * (0.9 if rate == 4.0 and v == "zmq-curve" else 0.999), 0.4, 1.5)
             for rate in rates for v in variants if v != "mooncake-engine"}  # fmt: skip
    costs = compare.byte_costs(1 << 16, 1 << 12)
    assert set(costs) == set(COSTS), "the per-byte costs the script measures"
    config = {"variants": variants, "sizes": sizes, "chunks": chunks, "modes": modes, "rates_gbps": rates,
              "paced_mib": 64.0, "repeats": 3, "cost_total_bytes": compare.COST_TOTAL_BYTES,
              "cost_piece_bytes": compare.COST_PIECE_BYTES, "cpu_count": 2, "loadavg_at_end": (7.52, 8.0, 9.1),
              "python": "3.12.3", "pyzmq": "27.1.0", "libzmq": "4.3.5", "mooncake": "0.3.13.post1"}  # fmt: skip
    document = compare.document(config, COSTS, compare.unpaced_rows(unpaced), compare.paced_rows(paced))
    return json.loads(json.dumps(document))


def test_the_throughput_table_gives_each_cell_the_shown_variants_and_mooncakes_ratios(transports):
    compare, report = transports
    document = _transport_document(compare)
    lead, _, header, rule, *lines = report.throughput_markdown(document).splitlines()
    assert lead == (f"{document['date']}, commit {document['commit']}; 2 cores, load average 7.5 at the end; "
                    "3 repeats, variants round-robin; medians of the repeats, Gbit/s:")  # fmt: skip
    assert header == ("| payload | chunk | `zmq` | `zmq-curve` | `mooncake` | `mooncake-engine` | mooncake / zmq "
                      "| mooncake / zmq-curve |")  # fmt: skip
    assert rule.count("---") == 8 and len(lines) == 8
    assert lines[0] == "| raw, 16 MiB | 1 MiB | 5.0 | 4.0 | 9.0 | 8.0 | 1.80 | 2.25 |"
    assert lines[3] == "| raw, 64 MiB | 4 MiB | 40.0 | 32.0 | 48.0 | 64.0 | 1.20 | 1.50 |"
    assert lines[4] == "| frames, 16 MiB | 1 MiB | 2.5 | 2.0 | 4.5 | — | 1.80 | 2.25 |"


def test_the_cpu_table_spans_every_cell_and_gives_paced_accuracy_then_the_per_byte_costs(transports):
    compare, report = transports
    text = report.cpu_markdown(_transport_document(compare))
    lead, _, header, _, sender, receiver, paced_1, paced_4, _, costs = text.splitlines()
    assert lead.endswith("paced accuracy (achieved / set rate; 64 MiB, 1 MiB chunks, frames), same run:")
    assert header == "|  | `zmq` | `zmq-curve` | `mooncake` | `mooncake-engine` |"
    # variants index 0, 1, 3, 5: CPU 0.1 x (index + 1) at 16 MiB, twice that at 64; frames five times the raw.
    assert sender == "| sender CPU s/GB | 0.10-0.20 | 0.20-0.40 | 0.40-0.80 | 0.60-1.20 |"
    assert receiver == ("| receiver CPU s/GB, raw / frames | 0.10-0.20 / 0.50-1.00 | 0.20-0.40 / 1.00-2.00 "
                        "| 0.40-0.80 / 2.00-4.00 | 0.60-1.20 / — |")  # fmt: skip
    assert paced_1 == "| paced at 1 Gbit/s | 0.999 | 0.999 | 0.999 | — |"
    assert paced_4 == "| paced at 4 Gbit/s | 0.999 | 0.900 | 0.999 | — |"
    assert costs == ("Per byte (1 MiB pieces): the frame MAC (keyed BLAKE2b-128) 1.07 s/GB, 7.5 Gbit/s per core; "
                     "a copy into a warm buffer 0.0231 s/GB, out into new `bytes` 0.31 s/GB, into a fresh 1 GiB "
                     "buffer (as `RequestAssembly` does: every page touched first) 2.2 s/GB.")  # fmt: skip


def test_the_idle_cpu_table_gives_each_modes_cores_idle_and_waiting():
    import idle_cpu

    window = {"server_cores": 0.0351, "scheduler_cores": 0.0312, "window_s": 15.0}
    document = {"date": "2026-12-07", "commit": "abc1234", "window_s": 15.0, "prompt_tokens": 1024,
                "rows": [{"mode": "lynx", "idle": {**window, "server_cores": 0.019, "scheduler_cores": 0.017},
                          "waiting": window, "rooms_waiting": 4, "requests": 4, "completed": 4}]}  # fmt: skip
    lines = idle_cpu.markdown(document).splitlines()
    assert lines[0].startswith("2026-12-07, commit abc1234: 15 s windows, prompts of 1,024 tokens")
    assert lines[-1] == "| `lynx` | 0.019 / 0.017 | 4 | 0.035 / 0.031 | 4 of 4 |"
