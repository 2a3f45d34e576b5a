"""The serving-load benchmark's pure parts: its plan, link arithmetic, trace scaling, summaries and report."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmark"))

from load import report  # noqa: E402
from load.plan import PROFILES, Link, Point, Profile, base_mode, link_for, points, variant_args  # noqa: E402
from load.stats import lynx_timeline, percentile  # noqa: E402
from load.trace import scale_trace  # noqa: E402

BYTES = {"bf16": 1200, "int8": 640, "int4": 340, "lynx": 640, "auto": 640, "stock": 1200}


def test_the_link_puts_bf16s_transfer_at_the_asked_multiple_of_the_prefill_and_rates_load_int8s_share():
    link = link_for(prefill_s=2.0, stream_bytes=BYTES, bf16_over_prefill=3.0)
    assert link.transfer_s("bf16") == pytest.approx(6.0, rel=1e-4)
    assert link.rate_for(0.5) * link.transfer_s("int8") == pytest.approx(0.5)
    assert link.utilization("int4", link.rate_for(1.0)) == pytest.approx(340 / 640)


def test_every_mode_runs_every_load_and_the_extra_points_only_where_asked():
    profile = Profile(modes=("int8", "lynx"), loads=(0.3, 0.9), shared_prefix_modes=("lynx",), trace_modes=(),
                      fan_in_modes=("int8",))  # fmt: skip
    keys = [p.key for p in points(profile)]
    assert keys == ["1p1d/random-ids/0.3/int8", "1p1d/random-ids/0.9/int8", "1p1d/random-ids/0.3/lynx",
                    "1p1d/random-ids/0.9/lynx", "1p1d/generated-shared-prefix/0.85/lynx",
                    "2p1d/random-ids/0.85/int8"]  # fmt: skip
    assert Point("lynx", "trace", None).key == "1p1d/trace/trace/lynx"


def test_variants_add_server_options_and_bad_names_are_refused():
    assert base_mode("lynx:strict") == "lynx"
    assert variant_args("lynx:strict:cap32") == ("--lynx-residual-priority", "strict", "--lynx-max-speculative-tokens", "32")
    with pytest.raises(ValueError, match="unknown"):
        Profile(modes=("int8", "lynx:fastest"))
    with pytest.raises(ValueError, match="include int8"):
        Profile(modes=("lynx",))
    assert PROFILES["default"].modes[1] == "int8"


def test_a_trace_window_is_scaled_to_this_machine_keeping_shared_prefixes_and_busy_steps():
    rows = [{"timestamp": t, "input_length": 512 * n, "output_length": 300, "hash_ids": list(range(n))}
            for t, n in ((0, 16), (1000, 16), (1000, 8), (5000, 64), (9000, 1))]  # fmt: skip
    scaled = scale_trace(rows, 0, 4, input_tokens=520, output_tokens=24, rate=1.0)
    # the two requests stamped 1000 are spread over 1000..5000: arrivals 0, 1000, 3000, 5000, then 3 gaps in 3 s
    assert [r["timestamp"] for r in scaled] == [0, 600, 1800, 3000]
    assert [len(r["hash_ids"]) for r in scaled] == [4, 4, 2, 8], "at most twice the median prompt"
    assert all(r["hash_ids"] == list(range(len(r["hash_ids"]))) for r in scaled)
    assert {r["output_length"] for r in scaled} == {24}


def test_percentiles_and_the_lynx_timeline_of_records():
    assert percentile([1, 2, 3, 4], 50) == 2.5 and percentile([], 99) is None
    records = [{"success": True, "lynx": {"anchor_ready_s": 1.0, "residual_ready_s": 3.0, "speculative_tokens": 4,
                                          "accepted_tokens": 3, "rollbacks": 1, "verify_batch": 2}},
               {"success": True, "lynx": {"anchor_ready_s": 2.0, "residual_ready_s": 2.5, "speculative_tokens": 0,
                                          "accepted_tokens": 0, "rollbacks": 0}}]  # fmt: skip
    timeline = lynx_timeline(records)
    assert timeline["residual_after_anchor_max_s"] == 2.0 and timeline["acceptance"] == 0.75
    assert timeline["verify_batch_max"] == 2


def _row(mode, load, ttft, e2e):
    return {"key": f"1p1d/random-ids/{load:g}/{mode}", "mode": mode, "dataset": "random-ids", "topology": "1p1d",
            "load": load, "rate": 0.1, "ttft_p50_ms": ttft, "ttft_p99_ms": 2 * ttft, "tpot_p99_ms": 100.0,
            "e2e_p50_ms": e2e, "e2e_p99_ms": 2 * e2e, "goodput": 0.1, "utilization": 0.5, "errors": [], "records": []}  # fmt: skip


def test_the_report_compares_lynx_with_int8_and_int4_at_each_point():
    result = {"link": {"gbps": 0.02, "prefill_s": 1.0, "bf16_over_prefill": 3.0},
              "profile": {"requests": 16, "input_tokens": 512, "output_tokens": 24}, "ttft_slo_ms": 4000.0,
              "rows": [_row("int8", 0.5, 4000.0, 8000.0), _row("int4", 0.5, 1000.0, 5000.0),
                       _row("lynx", 0.5, 1100.0, 7600.0)],
              "exactness": {"total": {"answers": 16, "tokens_judged": 384, "equal": 16, "equal_after_near_ties": 0,
                                      "near_ties": 0, "reference_continuations": 0, "wrong": 0,
                                      "without_reference": 0, "failed_requests": 0}}}  # fmt: skip
    (comparison,) = report.comparisons(result)
    assert comparison["ttft_p50_vs_int8"] == pytest.approx(0.275) and comparison["ttft_p50_vs_int4"] == pytest.approx(1.1)
    assert comparison["e2e_p50_vs_int8"] == pytest.approx(0.95)
    text = report.markdown(json.loads(json.dumps(result)))
    assert "| 1p1d random-ids 0.5 | lynx | 0.100 | 1100 |" in text and "16 equal to int8's" in text


def _kv_cache_dtype(server) -> str:
    """The KV cache dtype a server is started with (SGLang takes an option's last value)."""
    command = [str(arg) for arg in server.command]
    return [command[i + 1] for i, arg in enumerate(command) if arg == "--kv-cache-dtype"][-1]


def test_the_stock_fp8_pair_is_sglangs_own_with_an_fp8_kv_cache_on_both_servers(tmp_path):
    from load.deployments import pair

    profile = Profile(modes=("int8", "stock-fp8"), extra={"model": str(tmp_path)})
    link = link_for(prefill_s=2.0, stream_bytes=BYTES, bf16_over_prefill=3.0)
    pd = pair("stock-fp8", link, profile, tmp_path, shaped=True)
    for server in (pd.prefill, pd.decode):
        command = " ".join(map(str, server.command))
        assert _kv_cache_dtype(server) == "fp8_e4m3" and "--disaggregation-transfer-backend mooncake" in command
        assert "--lynx" not in command.split()
    assert _kv_cache_dtype(pair("stock", link, profile, tmp_path, shaped=True).prefill) == "bfloat16"
    assert "stock-fp8" in PROFILES["default"].modes


def test_the_recording_parser_keeps_the_last_event_and_reads_sse_comments_as_empty_events():
    """smg sends ``: ping`` on a quiet stream; bench_serving's client would fail the request on it."""
    import orjson
    from load.capture import _LAST_EVENT, _RecordingJson

    parser = _RecordingJson(orjson)
    holder = [None, None]
    token = _LAST_EVENT.set(holder)
    try:
        assert parser.loads(b": ping") == {} and parser.loads(memoryview(b": ping")) == {}
        parser.loads(b'{"text": "a", "meta_info": {"completion_tokens": 1}}')
        parser.loads(b'{"error": {"message": "residual KV failed"}}')
        assert holder[1] == '{"message": "residual KV failed"}'
        with pytest.raises(orjson.JSONDecodeError):
            parser.loads(b"upstream connect error")
    finally:
        _LAST_EVENT.reset(token)
    assert holder[0]["meta_info"] == {"completion_tokens": 1}
    assert holder[1] == "upstream connect error"


def test_a_recorded_error_names_the_repositorys_files_relative_to_it():
    from types import SimpleNamespace

    from load import capture

    trace = f'Traceback:\n  File "{capture.ROOT}/benchmark/load/capture.py", line 9\nValueError: bad event'
    request = SimpleNamespace(prompt=[1, 2], prompt_len=2, output_len=4)
    output = SimpleNamespace(success=False, error=trace, start_time=0.0, ttft=0.0, latency=0.0, itl=[],
                             generated_text="", output_len=0)  # fmt: skip
    record = capture._record(None, request, output, 0.0)
    assert record["error"] == 'Traceback:\n  File "benchmark/load/capture.py", line 9\nValueError: bad event'


def test_per_request_timelines_pair_each_answer_with_int8s_of_the_same_arrival_and_split_rollbacks():
    def record(arrival, e2e, residual, rollbacks=0, drafted=16):
        return {"arrival_s": arrival, "ok": True, "e2e_s": e2e, "anchor_ready_s": residual, "residual_ready_s": residual,
                "speculative_tokens": drafted, "rollbacks": rollbacks}  # fmt: skip

    int8, lynx = _row("int8", 0.85, 3000.0, 5000.0), _row("lynx", 0.85, 1500.0, 5000.0)
    # int8's records in another order than lynx's (sent at the same arrivals); one lynx request failed
    int8["records"] = [record(1.002, 5.0, 3.0), record(0.0, 4.0, 2.0), record(2.5, 6.0, 4.0)]
    lynx["records"] = [record(0.0, 3.6, 2.5), record(1.0, 6.0, 3.5, rollbacks=1, drafted=10),
                       dict(record(2.5, 9.0, 9.0), ok=False)]  # fmt: skip
    (t,) = report.timelines({"rows": [int8, lynx]})
    assert (t["requests"], t["rolled_back"]) == (2, 1)
    assert t["e2e_vs_int8_kept"] == pytest.approx(0.9) and t["e2e_vs_int8_rolled_back"] == pytest.approx(1.2)
    assert t["residual_after_int8_s"] == pytest.approx(0.5) and t["drafted"] == 13
    assert "| 1p1d/random-ids/0.85 | lynx | 1 of 2 | 0.90 | 1.20 | 0.50 | 13 |" in report.timeline_table({"rows": [int8, lynx]})


def test_the_comparison_counts_requests_within_twice_the_modes_own_idle_ttft_beside_int8s():
    int8, lynx = _row("int8", 0.85, 3000.0, 5000.0), _row("lynx", 0.85, 1500.0, 5000.0)
    int8["records"] = [{"ok": True, "ttft_s": t} for t in (2.0, 3.5, 4.0)]
    lynx["records"] = [{"ok": True, "ttft_s": 1.2}, {"ok": True, "ttft_s": 2.9}, {"ok": False, "ttft_s": 0.1}]
    result = {"rows": [int8, lynx], "idle": {"lynx": {"ttft_s": 1.5}, "int8": {"ttft_s": 2.5}}}
    (comparison,) = report.comparisons(result)
    assert comparison["within_own_slo"] == "2 vs 1 of 3", "3.0 s: a failed request never counts"
    assert report.comparisons({"rows": [int8, lynx]})[0]["within_own_slo"] is None


def test_the_idle_link_bound_pairs_run_on_a_slower_link_and_the_report_gives_int8_over_lynx():
    link = link_for(prefill_s=2.0, stream_bytes=BYTES, bf16_over_prefill=3.0)
    slow = link_for(link.prefill_s, link.stream_bytes, PROFILES["default"].idle_bf16_over_prefill)
    assert slow.transfer_s("bf16") == pytest.approx(8.0, rel=1e-4) and slow.gbps < link.gbps
    assert PROFILES["default"].idle_modes == ("int8", "lynx") and PROFILES["smoke"].idle_modes == ()
    with pytest.raises(ValueError, match="paced by Lynx"):
        Profile(idle_modes=("stock",))
    with pytest.raises(ValueError, match="idle_bf16_over_prefill"):
        Profile(idle_bf16_over_prefill=-1.0)
    bound = {"input_tokens": 2048, "link": {"gbps": 0.008, "bf16_over_prefill": 4.0, "prefill_s": 2.0,
                                            "stream_bytes": {"int4": 4_000_000}},
             "idle": {"int8": {"ttft_s": 2.6, "e2e_s": 3.6}, "lynx": {"ttft_s": 4.51}}}  # fmt: skip
    line = report.idle_link_bound_line({"idle_link_bound": bound, "profile": {"output_tokens": 11}})
    assert "2048-token prompts" in line and "4.00x their prefill of 2.00 s" in line
    assert "`int8` 2.60 s, `lynx` 4.51 s; `int8` / `lynx` 0.58" in line
    assert "`lynx`'s first token 1.10x its anchor's bytes at the link rate (4.00 s) plus one of `int8`'s idle decode steps (0.10 s)" in line
    only_int8 = {**bound, "idle": {"int8": bound["idle"]["int8"]}}
    assert report.idle_link_bound_line({"idle_link_bound": only_int8}).endswith("`int8` 2.60 s.")
    assert report.idle_link_bound_line({}) is None
