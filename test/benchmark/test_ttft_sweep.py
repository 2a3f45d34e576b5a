"""The TTFT sweep: its verdict arithmetic and request bodies, and one end-to-end run on a real PD pair."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARK = Path(__file__).resolve().parents[2] / "benchmark"
if str(BENCHMARK) not in sys.path:
    sys.path.insert(0, str(BENCHMARK))


def _sweep():
    spec = importlib.util.spec_from_file_location("ttft_sweep", BENCHMARK / "ttft_sweep.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _row(mode, kind, segment=512, rate=0.02, **times):
    return {"mode": mode, "link_gbps": rate, "prompt_tokens": 1000, "request_type": kind,
            "segment_tokens": segment, **times}  # fmt: skip


def test_verdicts_compare_lynx_t1_with_int4_and_later_tokens_with_int8():
    sweep = _sweep()
    rows = [
        _row("int4", "greedy", t1_s=10.0, t8_s=12.0),
        _row("int8", "greedy", t1_s=13.0, t8_s=14.0),
        _row("lynx", "greedy", t1_s=10.4, t8_s=13.9),
        _row("int4", "json", t1_s=10.0, t8_s=12.0),
        _row("int8", "json", t1_s=13.0, t8_s=14.0),
        _row("lynx", "json", t1_s=10.6, t8_s=13.0),
    ]
    (greedy, json_row) = sweep.verdicts(rows)
    assert greedy["met"] and greedy["t1_vs_int4"] == pytest.approx(1.04) and greedy["t8_vs_int8"] < 1
    assert not json_row["met"], "t1 more than 5% behind int4"
    floor = _row("floor", "greedy", segment=None, rate=None, t1_s=5.0)
    (alone,) = sweep.verdicts([_row("lynx", "greedy", t1_s=10.4), floor])
    assert alone["met"] is None and alone["t1_vs_floor"] == pytest.approx(2.08), "nothing to judge lynx by"


def test_pipelining_and_the_floor_are_compared_at_equal_points():
    sweep = _sweep()
    rows = [
        _row("lynx", "greedy", t1_s=9.0),
        _row("lynx", "greedy", segment=0, t1_s=12.0),
        _row("int4", "greedy", t1_s=8.8),
        _row("floor", "greedy", segment=None, rate=None, t1_s=7.5),
    ]
    (verdict,) = sweep.verdicts(rows)
    assert verdict["t1_vs_floor"] == pytest.approx(1.2) and verdict["t1_vs_int4"] == pytest.approx(9.0 / 8.8)
    (pipelined,) = sweep.pipelining(rows)
    assert pipelined["mode"] == "lynx" and pipelined["t1_on_over_off"] == pytest.approx(0.75)


def test_overlap_sets_lynx_t1_against_the_larger_of_prefill_and_anchor_transfer_plus_a_step():
    sweep = _sweep()
    anchor_bytes = 2_500_000  # 1 s at 0.02 Gbit/s
    rows = [
        _row("lynx", "greedy", t1_s=3.3, t8_s=5.0, prefill_s=3.0, stream_bytes=[anchor_bytes, 2_000_000]),
        _row("int8", "greedy", t1_s=6.6, t8_s=7.3, prefill_s=3.1, stream_bytes=[4_500_000]),
        _row("lynx", "greedy", rate=0.005, t1_s=4.4, t8_s=5.1, prefill_s=3.0, stream_bytes=[anchor_bytes, 2_000_000]),
    ]
    fast, slow = sweep.overlap(rows)
    # The decode step comes from int8's row (lynx holds its drafts back: its t1..t8 are not steps).
    assert fast["anchor_s"] == pytest.approx(1.0) and fast["step_s"] == pytest.approx(0.1)
    assert fast["t1_vs_bound"] == pytest.approx(3.3 / 3.1) and fast["int8_over_lynx_t1"] == pytest.approx(2.0)
    assert slow["anchor_s"] == pytest.approx(4.0) and slow["t1_vs_bound"] == pytest.approx(4.4 / 4.1)
    assert "int8_over_lynx_t1" not in slow
    per_request = sweep.overlap([{**rows[0], "request_prefill_s": 3.2}, rows[1]])[0]
    assert per_request["prefill_s"] == 3.2 and per_request["t1_vs_bound"] == pytest.approx(3.3 / 3.3)


def test_frames_take_the_asked_time_on_the_emulated_link_within_the_servers_bounds():
    sweep = _sweep()
    assert sweep.chunk_bytes(0.02, 10) == 25_000  # 2.5 MB/s for 10 ms
    assert sweep.chunk_bytes(100, 10) == 1 << 20  # never above the server default
    assert sweep.chunk_bytes(0.0001, 10) == 4 << 10  # never below the smallest frame the server accepts
    assert sweep.chunk_bytes(0, 10) is None and sweep.chunk_bytes(0.02, 0) is None


@pytest.mark.slow
def test_every_request_type_runs_to_the_token_budget():
    from transformers import AutoTokenizer
    from lynx_deploy.models import prepare_smollm2

    sweep = _sweep()
    tokenizer = AutoTokenizer.from_pretrained(str(prepare_smollm2()))
    for kind in sweep.REQUEST_TYPES:
        body = sweep.request_body(tokenizer, 64, 0, kind, 128, seed=3)
        params = body["sampling_params"]
        assert params["max_new_tokens"] == 128 and params["ignore_eos"]
    assert sweep.request_body(tokenizer, 64, 0, "sampled", 8, seed=3)["sampling_params"]["sampling_seed"] == 3
    assert sweep.request_body(tokenizer, 64, 0, "logprobs", 8, seed=3)["top_logprobs_num"] == 5
    # Every request asks for the top logprobs the judging of lynx against int8 reads.
    for kind, top in (("greedy", 2), ("json", 2), ("sampled", 20)):
        body = sweep.request_body(tokenizer, 64, 0, kind, 8, seed=3)
        assert body["return_logprob"] and body["top_logprobs_num"] == top
    assert json.loads(sweep.request_body(tokenizer, 64, 0, "json", 8, seed=3)["sampling_params"]["json_schema"])


def test_every_request_type_is_warmed_up_with_a_short_request_of_its_own(model_path):
    from transformers import AutoTokenizer

    sweep, tokenizer = _sweep(), AutoTokenizer.from_pretrained(str(model_path))
    kinds = list(sweep.REQUEST_TYPES)
    bodies = sweep.warm_up_bodies(tokenizer, kinds)
    assert len(bodies) == len(kinds)
    for kind, body in zip(kinds, bodies):
        assert body == sweep.request_body(tokenizer, sweep.WARM_UP_TOKENS, 999, kind, 4, seed=1)
        assert len(tokenizer(body["text"])["input_ids"]) < 4 * sweep.WARM_UP_TOKENS
    assert bodies[kinds.index("repetition")]["sampling_params"]["repetition_penalty"] > 1


def test_side_by_side_runs_lynx_beside_each_other_mode_of_one_link_rate():
    sweep = _sweep()
    points = [(m, r, 512, "zmq") for m in ("int4", "int8", "lynx") for r in (0.02, 0.08)]
    alone = sweep.point_groups(points, side_by_side=False)
    assert alone == [[p] for p in points]
    paired = sweep.point_groups(points, side_by_side=True)
    assert [[p[0] for p in g] for g in paired] == [["lynx", "int4"], ["lynx", "int8"]] * 2
    assert [{p[1] for p in g} for g in paired] == [{0.02}, {0.02}, {0.08}, {0.08}]
    two = [p for p in points if p[0] != "int8"]
    assert [[p[0] for p in g] for g in sweep.point_groups(two, side_by_side=True)] == [["int4", "lynx"]] * 2


def test_side_by_side_verdicts_set_each_mode_against_the_lynx_row_timed_beside_it():
    sweep = _sweep()
    rows = [
        _row("lynx", "greedy", t1_s=10.0, t8_s=11.0, group=1),
        _row("int4", "greedy", t1_s=9.8, t8_s=10.5, group=1),
        _row("lynx", "greedy", t1_s=11.0, t8_s=12.0, group=2),
        _row("int8", "greedy", t1_s=13.0, t8_s=12.5, group=2),
    ]
    (verdict,) = sweep.verdicts(rows)
    assert verdict["t1_vs_int4"] == pytest.approx(10.0 / 9.8)
    assert verdict["t8_vs_int8"] == pytest.approx(12.0 / 12.5) and verdict["met"]


def test_side_by_side_verdicts_add_the_median_of_the_per_request_ratios():
    sweep = _sweep()
    lynx_runs = [{"t1_s": 10.0, "t8_s": 11.0}, {"t1_s": 12.0, "t8_s": 13.0}, {"t1_s": 9.0, "t8_s": 10.0}]
    int4_runs = [{"t1_s": 10.0}, {"t1_s": 10.0}, {"t1_s": 10.0}]
    int8_runs = [{"t1_s": 11.0, "t8_s": 11.0}, {"t1_s": 11.0, "t8_s": 12.0}, {"t1_s": 11.0, "t8_s": 9.5}]
    rows = [
        _row("lynx", "greedy", t1_s=10.0, t8_s=11.0, group=1, runs=lynx_runs),
        _row("int4", "greedy", t1_s=10.0, group=1, runs=int4_runs),
        _row("lynx", "greedy", t1_s=10.0, t8_s=11.0, group=2, runs=lynx_runs),
        _row("int8", "greedy", t1_s=11.0, t8_s=11.0, group=2, runs=int8_runs),
    ]
    (verdict,) = sweep.verdicts(rows)
    assert verdict["paired"] == pytest.approx({"t1_vs_int4": 1.0, "t8_vs_int8": 10.0 / 9.5})
    assert verdict["t8_vs_int8"] == pytest.approx(1.0) and verdict["met"], "the verdict keeps the medians"
    apart = [{**row, "group": None} for row in rows]
    assert "paired" not in sweep.verdicts(apart)[0], "runs of deployments timed apart are not paired"


def test_agreement_counts_the_requests_where_lynx_output_equals_int8s():
    sweep = _sweep()
    runs = lambda *texts: [{"text": t, "prompt_tokens": 1000} for t in texts]  # noqa: E731
    lynx = sweep.summarize("lynx", 0.02, 1000, "greedy", 5.0, runs("a b", "c d", "e f"))
    int8 = sweep.summarize("int8", 0.02, 1000, "greedy", 5.0, runs("a b", "c x", "e f"))
    int4 = sweep.summarize("int4", 0.02, 1000, "greedy", 5.0, runs("z", "z", "z"))
    point = {"segment_tokens": 0, "transport": "zmq"}
    (entry,) = sweep.agreement([lynx | point, int4 | point, int8 | point])
    assert (entry["equal"], entry["compared"], entry["parted_repeats"]) == (2, 3, [1])
    assert sweep.agreement([lynx | point, int4 | point]) == []  # int4 is not expected to agree
    # A run without an output is left out, and the parting keeps its repeat number.
    lynx["runs"][0]["output_sha"] = None
    (entry,) = sweep.agreement([lynx | point, int8 | point])
    assert (entry["equal"], entry["compared"], entry["parted_repeats"]) == (1, 2, [1])


def _outputs():
    import ttft_outputs

    return ttft_outputs


def _tops(*steps):
    """SGLang's top-2 triples per position from ``(first, second, gap)``."""
    return [[[-0.1, a, None], [-0.1 - gap, b, None]] for a, b, gap in steps]


def test_lynx_runs_are_judged_token_by_token_against_int8_and_after_a_tie_against_its_continuation(monkeypatch):
    outputs = _outputs()
    asked = []

    def post(url, body):
        asked.append((url, body["input_ids"], body["sampling_params"]))
        return {"output_ids": [9], "meta_info": {"output_top_logprobs": _tops((9, 3, 1.0))}}

    monkeypatch.setattr(outputs, "post_json", post)
    ref = {"output_ids": [5, 6, 7], "tops": _tops((5, 1, 1.0), (6, 8, 0.01), (7, 1, 1.0)), "prompt_tokens": 3}
    int8 = _row("int8", "greedy", runs=[ref | {"request": [1000, r]} for r in range(3)])
    lynx_runs = [{"output_ids": [5, 6, 7]}, {"output_ids": [5, 8, 9]}, {"output_ids": [5, 8, 4]}]
    lynx = _row("lynx", "greedy", runs=[run | {"request": [1000, r]} for r, run in enumerate(lynx_runs)])
    body = {"text": "abc", "sampling_params": {"max_new_tokens": 3, "temperature": 0, "ignore_eos": True}}
    (summary,) = outputs.judge_rows([int8, lynx], lambda row, run: body, lambda text: [1, 2, 3],
                                    lambda: "http://ref", vocab=16)  # fmt: skip
    judged = lynx["judged"]
    assert (judged["equal"], judged["equal_after_near_ties"], judged["wrong"]) == (1, 1, 1) and not summary["ok"]
    assert asked[0] == ("http://ref/generate", [1, 2, 3, 5, 8], {"temperature": 0, "ignore_eos": True,
                                                                   "max_new_tokens": 1})  # fmt: skip
    assert [(p["request"], p["position"], p["kind"]) for p in judged["partings"]] == [
        (1, 1, "near_tie"), (2, 1, "near_tie"), (2, 2, "mismatch")]  # fmt: skip
    (entry,) = _sweep().agreement([int8, lynx])
    assert entry["judged"] is judged


def test_the_logprob_drift_of_greedy_runs_is_measured_on_the_tokens_before_a_parting():
    outputs = _outputs()
    ref = {"output_ids": [5, 6, 7], "tops": _tops((5, 1, 1.0), (6, 8, 1.0), (7, 1, 1.0)), "prompt_tokens": 3}
    moved = [[[-0.13, 5, None], [-1.2, 1, None]], [[-0.105, 6, None], [-1.1, 8, None]], [[-0.1, 9, None]]]
    int8 = _row("int8", "greedy", runs=[ref | {"request": [1000, r]} for r in range(2)])
    ids = [None, [[-8.0, 11, None]], [[-7.0, 11, None]]]  # none for the first token, as SGLang's PD gives
    int8["runs"][0]["ids_tops"] = ids
    moved_ids = [None, [[-8.05, 11, None]], [[-7.5, 11, None]]]
    lynx_runs = [{"output_ids": [5, 6, 7], "tops": moved, "ids_tops": moved_ids}, {"output_ids": [5, 6, 9], "tops": moved}]
    lynx = _row("lynx", "greedy", runs=[run | {"request": [1000, r]} for r, run in enumerate(lynx_runs)])
    body = {"text": "abc", "sampling_params": {"max_new_tokens": 3, "temperature": 0, "ignore_eos": True}}
    outputs.judge_rows([int8, lynx], lambda row, run: body, lambda text: [1, 2, 3], lambda: "unused", vocab=16)
    drift = lynx["judged"]["logprob_drift"]
    assert drift["positions"] == 4, "run 1's third token parts, run 0's is not in int8's tops: neither counts"
    assert drift["max"] == pytest.approx(0.03) and drift["mean"] == pytest.approx(0.0175)
    more = lynx["judged"]["logprob_drift_more"]
    assert more["top"]["values"] == 4 and more["top"]["max"] == pytest.approx(0.1), "the runner-ups both lists hold"
    assert more["token_ids"]["values"] == 2 and more["token_ids"]["max"] == pytest.approx(0.5)
    import ttft_verdicts

    sentence = ttft_verdicts._drift([lynx["judged"], {"answers": 1}])
    assert sentence == ("; returned logprobs of the same greedy tokens within 0.030 nats of `int8`'s (4 positions, "
                        "mean 0.0175), of the other top-list tokens within 0.100 nats (4 values, mean 0.0500), "
                        "of the asked token ids within 0.500 nats (2 values, mean 0.2750)")


def test_runs_whose_state_no_continuation_rebuilds_count_the_tokens_after_a_tie_unchecked():
    outputs = _outputs()
    ref = {"output_ids": [5, 6, 7], "tops": _tops((5, 1, 1.0), (6, 8, 0.01), (7, 1, 1.0)), "request": [1000, 0]}
    int8 = _row("int8", "json", runs=[ref])
    lynx = _row("lynx", "json", runs=[{"output_ids": [5, 8, 2], "request": [1000, 0]}])
    body = {"text": "abc", "sampling_params": {"temperature": 0, "json_schema": "{}"}}
    outputs.judge_rows([int8, lynx], lambda row, run: body, lambda text: [1, 2, 3], lambda: "unused", vocab=16)
    assert (lynx["judged"]["equal_after_near_ties"], lynx["judged"]["tokens_unchecked"]) == (1, 1)


def test_the_docs_table_sets_each_lynx_row_against_the_mode_beside_it_and_lists_every_parting():
    import ttft_verdicts

    lynx_runs = [{"t1_s": 5.0, "t8_s": 9.0}, {"t1_s": 5.2, "t8_s": 9.4}]
    judged = {"answers": 2, "tokens_judged": 256, "equal": 1, "equal_after_near_ties": 1, "wrong": 0,
              "near_ties": 1, "tokens_unchecked": 0,
              "partings": [{"request": 1, "position": 34, "kind": "near_tie", "gap": 0.008}]}  # fmt: skip
    spec = {"speculative_tokens": 32, "accepted_tokens": 30, "rollbacks": 1}
    rows = [
        _row("lynx", "greedy", t1_s=5.1, t8_s=9.2, group=1, runs=lynx_runs, bf16_transfer_to_prefill=3.6, **spec),
        _row("int4", "greedy", t1_s=5.0, group=1, runs=[{"t1_s": 5.0}, {"t1_s": 5.0}], bf16_transfer_to_prefill=3.5),
        _row("lynx", "greedy", t1_s=5.2, t8_s=9.0, group=2, runs=lynx_runs, judged=judged,
             bf16_transfer_to_prefill=4.2, **spec),
        _row("int8", "greedy", t1_s=9.0, t8_s=10.0, group=2, runs=[{"t1_s": 9.0, "t8_s": 10.0}] * 2,
             bf16_transfer_to_prefill=4.0),
    ]  # fmt: skip
    header, rule, row, blank, total, parting = ttft_verdicts.markdown({"rows": rows}).splitlines()
    assert header.split(" | ")[7] == "lynx/int8 t8" and rule.count("---") == 12
    assert row == ("| 3.5-4.2 | greedy | 5.00 | 5.10 | 1.02 (1.02) | 9.00 | 5.20 | 0.90 (0.92) | 32 (30), 32 (30) | 2 "
                   "| 2 of 2, 1 near tie | met |")  # fmt: skip
    assert total.startswith("1 of 1 cells meet the bar") and total.endswith("2 answers, 256 tokens, 1 near tie, 0 wrong:")
    assert parting == "- 0.02 Gbit/s, greedy, repeat 1: near tie at output token 34, gap 0.0080 nats"
    dated = {"rows": rows, "date": "2026-12-07", "commit": "abc1234", "wall_s": 1800, "args": {"repeats": 2}}
    assert ttft_verdicts.markdown(dated).startswith("2026-12-07, commit abc1234, 30 min; medians of 2 repeats, seconds:\n\n| ")
    without4 = ttft_verdicts.markdown({"rows": [r for r in rows if r["mode"] != "int4"]}).splitlines()
    assert "int4" not in without4[0] and without4[2].startswith("| 3.6-4.2 | greedy | 9.00 | 5.20 | 0.90 (0.92) | 32 (30), 32 (30) |")


def test_the_json_keeps_each_runs_tokens_but_not_its_top_logprobs(tmp_path):
    sweep = _sweep()
    run = {"t1_s": 5.0, "prompt_tokens": 1072, "output_ids": [5, 6], "tops": _tops((5, 1, 1.0), (6, 1, 1.0))}
    row = sweep.summarize("int8", 0.02, 1072, "greedy", 6.5, [run]) | {"segment_tokens": 512, "transport": "zmq"}
    args = sweep.parse_args(["--json", str(tmp_path / "sweep.json")])
    sweep.write_json(args, [row])
    (kept,) = json.loads((tmp_path / "sweep.json").read_text())["rows"][0]["runs"]
    assert kept["output_ids"] == [5, 6] and "tops" not in kept and row["runs"][0]["tops"]


def test_unknown_request_types_are_refused():
    with pytest.raises(SystemExit):
        _sweep().parse_args(["--request-types", "greedy,haiku"])


@pytest.mark.server
def test_lynx_point_reports_nth_tokens_arrivals_acceptance_and_verify_stages(tmp_path, model_path):
    out = tmp_path / "sweep.json"
    command = [
        sys.executable, str(BENCHMARK / "ttft_sweep.py"), "--modes", "lynx", "--link-gbps", "0.004",
        "--prompt-tokens", "512", "--request-types", "greedy,logprobs", "--repeats", "1", "--max-tokens", "8",
        "--nth", "1,8", "--via", "direct", "--json", str(out), "--log-dir", str(tmp_path / "logs"),
    ]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=900, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "xfer/pf" in result.stdout and "accept" in result.stdout
    rows = json.loads(out.read_text())["rows"]
    assert [r["request_type"] for r in rows] == ["greedy", "logprobs"]
    for row in rows:
        assert row["mode"] == "lynx" and row["prompt_tokens"] > 512 and row["prefill_s"] > 0
        assert 0 < row["request_prefill_s"] < row["t1_s"], "the prefill answers before the first token streams"
        assert 0 < row["t1_s"] <= row["t8_s"]
        assert 0 < row["anchor_ready_s"] <= row["residual_ready_s"]
        assert len(row["stream_bytes"]) == 2 and row["stream_bytes"][0] > 0
        assert 0 <= row["accepted_tokens"] <= row["speculative_tokens"]
    assert sum(r["speculative_tokens"] for r in rows) > 0
    assert all(len(run["output_sha"]) == 16 for row in rows for run in row["runs"])
    assert all(len(run["output_ids"]) == 8 for row in rows for run in row["runs"]), "every run keeps its tokens"


def test_the_floor_rows_summarize_without_a_wire_format(tmp_path):
    sweep = _sweep()
    run = {"t1_s": 5.0, "t8_s": 5.7, "prompt_tokens": 1072, "completion_tokens": 16}
    row = sweep.summarize(sweep.FLOOR, None, 1072, "greedy", 6.5, [run, {**run, "t1_s": 5.4}, {**run, "t1_s": 4.8}])
    assert row["stream_bytes"] == [] and row["t1_s"] == 5.0 and row["repeats"] == 3
    args = sweep.parse_args(["--json", str(tmp_path / "sweep.json")])
    sweep.write_json(args, [row | {"segment_tokens": None, "transport": None}])
    assert json.loads((tmp_path / "sweep.json").read_text())["rows"][0]["mode"] == "floor"
