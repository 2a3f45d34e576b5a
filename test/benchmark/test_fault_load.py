"""The fault-under-load benchmark's pure parts: its plan, a fault's outcome from per-request records,
the idle levels' comparison, the verdict and the table."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections import Counter
from pathlib import Path

import psutil
import pytest

BENCHMARK = Path(__file__).resolve().parents[2] / "benchmark"
sys.path.insert(0, str(BENCHMARK))

from faults import levels  # noqa: E402
from faults.inject import ABORT_STATES  # noqa: E402
from faults.mixed import KINDS  # noqa: E402
from faults.outcome import Judge, answered, outcome, reason  # noqa: E402
from faults.plan import FAULTS, PROFILES, Profile  # noqa: E402
from faults.report import QUIET_SENTENCE, markdown, matrix_markdown, passed, passed_deployment, pd_soak_markdown, single_markdown  # noqa: E402
from faults.soak import slope_per_hour  # noqa: E402
from faults.soak import summary as soak_summary  # noqa: E402


def _record(prompt, output, finish="length", success=True, error="", top2=None, drafted=3, started=100.0, latency=2.0):
    return {"success": success, "prompt_ids": list(prompt), "output_len": len(output) or 4, "output_ids": list(output),
            "top2": top2 if top2 is not None else [[[-0.1, t], [-3.0, t + 1]] for t in output],
            "finish_reason": {"type": finish} if finish else None, "error": error, "lynx": {"speculative_tokens": drafted},
            "started_wall": started, "latency_s": latency}  # fmt: skip


class _Reference:
    """A reference decoder: after any prefix, the next token is the prefix's length (a wide margin)."""

    def __init__(self):
        self.calls = 0

    def __call__(self, prefix, n):
        self.calls += 1
        tokens = list(range(len(prefix), len(prefix) + n))
        return tokens, [((t, -0.1), (t + 1, -3.0)) for t in tokens]


def test_profiles_run_none_first_and_refuse_unknown_faults():
    assert Profile(faults=("stall", "abort")).ordered_faults == ("none", "abort", "stall")
    assert PROFILES["default"].ordered_faults == FAULTS
    assert PROFILES["full"].deployments() == [("zmq", 1), ("zmq", 3), ("mooncake", 1), ("mooncake", 3)]
    with pytest.raises(ValueError, match="unknown faults"):
        Profile(faults=("flood",))
    with pytest.raises(ValueError, match="transport"):
        Profile(prefills=(0,))


def test_an_aborted_stream_is_a_failure_with_the_servers_reason():
    aborted = _record((1, 2), (2,), finish="abort")
    aborted["finish_reason"]["message"] = "residual KV failed: the prefill died"
    assert not answered(aborted) and reason(aborted) == "residual KV failed: the prefill died"
    aborted["finish_reason"]["message"] = ("Decode transfer failed for request rank=0 decode_req.req.rid='a' decode_req."
                                           "req.bootstrap_room=5 with exception KVTransferError(bootstrap_room=5): "
                                           "KV of the request made no progress for 20s")  # fmt: skip
    assert reason(aborted) == "KV of the request made no progress for 20s"
    refused = _record((1, 2), (), finish=None, success=False,
                      error="Traceback (most recent call last):\n  ...\nClientConnectorError: Cannot connect to host")
    assert reason(refused) == "ClientConnectorError: Cannot connect to host"
    carried = _record((1, 2), (), finish=None, success=False, error="the stream carried '{\"message\": \"x\"}'; Traceback")
    assert reason(carried) == "the stream carried '{\"message\": \"x\"}'"


def test_outcome_judges_answers_counts_failures_hung_and_asks_each_reference_once():
    reference = _Reference()
    judge = Judge(reference)
    prompt = (5, 6, 7)
    right = _record(prompt, (3, 4, 5, 6))
    wrong = _record(prompt, (3, 9, 5, 6))
    failed = _record((8, 9), (), finish=None, success=False, error="ClientPayloadError: Response payload is not completed",
                     started=100.0, latency=12.5)  # fmt: skip
    result = outcome([right, wrong, failed], sent=4, fault_wall=105.0, judge=judge)
    assert (result["answered"], result["failed"], result["hung"], result["drafted"]) == (2, 1, 1, 2)
    assert result["wrong"] == 1 and result["judged"]["partings"][0]["position"] == 1
    assert result["unclear_errors"] == 0 and result["last_failure_after_fault_s"] == 7.5
    assert reference.calls == 1  # the prompt's reference answer; a wide-margin parting needs no continuation
    outcome([right], sent=1, fault_wall=None, judge=judge)
    assert reference.calls == 1


def test_a_text_prompt_is_tokenized_as_the_server_did_before_it_is_judged():
    """`generated-shared-prefix` records carry the prompt's text, not its ids (the soak's every other round)."""
    reference = _Reference()
    record = {**_record((), (3, 4, 5)), "prompt_ids": None, "prompt_text": "abc"}
    result = outcome([record], sent=1, fault_wall=None, judge=Judge(reference, encode=lambda text: [7] * len(text)))
    assert result["wrong"] == 0 and result["judged"]["tokens_judged"] == 3, result


def _level(free=100, rows=10, rooms=0, rss=1000.0, threads=50, fds=40, tcp=4):
    return {"kv_free_slots": free, "req_rows_free": rows, "transfer_rooms": rooms, "rss_mib": rss, "threads": threads,
            "fds": fds, "fd_kinds": {"tcp": tcp, "eventfd": fds - tcp}}  # fmt: skip


def test_levels_count_what_is_held_beyond_the_baseline():
    baseline = {"prefill": _level(), "decode": _level()}
    now = {"prefill": _level(rss=1030.0, fds=42, tcp=6), "decode": _level(free=90, rows=9, rooms=1, threads=49)}
    assert not levels.idle(now, baseline)
    held = levels.compare(now, baseline)
    assert (held["slots_held"], held["rows_held"], held["rooms_held"]) == (10, 1, 1)
    assert (held["memory_ratio"], held["threads_delta"], held["fds_delta"]) == (1.03, -1, 2)
    assert held["fd_growth"] == {"prefill": {"tcp": 2}}, "what grew, by kind"
    assert levels.idle({"prefill": _level(), "decode": _level(free=120)}, baseline)
    assert levels.compare({"prefill": None, "decode": _level()}, baseline)["unanswering"] == ["prefill"]


def test_a_process_descriptors_are_told_apart_by_kind():
    before = levels.fd_kinds(psutil.Process())
    listener = socket.create_server(("127.0.0.1", 0))
    read, write = os.pipe()
    try:
        after = levels.fd_kinds(psutil.Process())
    finally:
        listener.close()
        os.close(read)
        os.close(write)
    assert after - before == Counter({"tcp": 1, "pipe": 2}), (before, after)


def _fault(fault="stall", **changes):
    base = {"fault": fault, "requests": 10, "answered": 8, "drafted": 8, "failed": 2, "wrong": 0, "hung": 0,
            "unclear_errors": 0, "slots_held": 0, "rows_held": 0, "rooms_held": 0, "unanswering": [],
            "memory_ratio": 1.01, "threads_delta": 0, "fds_delta": 1, "serves_after": True, "serving_again_s": 0.4}  # fmt: skip
    return {**base, **changes}


@pytest.mark.parametrize(
    "changes",
    [{"wrong": 1}, {"hung": 1}, {"unclear_errors": 1}, {"slots_held": 4}, {"rooms_held": 1}, {"memory_ratio": 1.06},
     {"serves_after": False}, {"unanswering": ["decode"]}, {"fault": "abort"}],
)  # fmt: skip
def test_a_fault_fails_on_any_wrong_hung_held_or_unexpected_failure(changes):
    assert passed(_fault())
    assert not passed(_fault(**changes))


def test_the_table_has_a_row_per_fault_with_its_verdict():
    faults = [dict(_fault("none", failed=0), passed=True), dict(_fault(wrong=1), passed=False)]
    result = {"profile": Profile().__dict__, "date": "2026-12-06", "commit": "abc1234", "wall_s": 600,
              "deployments": [{"transport": "zmq", "prefills": 3, "faults": faults}]}  # fmt: skip
    table = markdown(result)
    assert "| zmq, 3 prefills | none | 8 of 10 (8) | 0 |" in table and table.count("| pass |") == 1
    assert "| zmq, 3 prefills | stall |" in table and table.rstrip().endswith("| 0.4 s | FAIL |")


def test_the_matrix_has_a_row_per_fault_a_column_per_deployment_and_the_spans_above():
    def deployment(transport, prefills, kill_restart_s, failing=False):
        faults = [dict(_fault("none", failed=0, answered=10, drafted=9), passed=True),
                  dict(_fault("drop", note={"connections_reset": 2}, fds_delta=-3), passed=True),
                  dict(_fault("kill-prefill", answered=1, drafted=1, serving_again_s=37.2, threads_delta=-6,
                              note={"restart_s": kill_restart_s}, wrong=int(failing)), passed=not failing)]
        return {"transport": transport, "prefills": prefills, "faults": faults}

    result = {"profile": Profile().__dict__, "date": "2026-12-06", "commit": "abc1234", "wall_s": 600,
              "deployments": [deployment("zmq", 1, 32.1), deployment("mooncake", 3, 51.6)]}  # fmt: skip
    caption, _, header, _, *rows = matrix_markdown(result).splitlines()
    assert header == "| fault | zmq, 1 prefill | mooncake, 3 prefills |"
    assert "memory x1.010 of idle, threads -6 to +0, file descriptors -3 to +1" in caption
    assert "again 0.4 s after the recovery" in caption and caption.endswith("every fault passed.")
    assert rows == ["| none | 10 (9) | 10 (9) |", "| drop | 8 (8), 2 reset | 8 (8), 2 reset |",
                    "| kill-prefill | 1 (1); up in 32.1 s, serving 37.2 s after | 1 (1); up in 51.6 s, serving 37.2 s after |"]  # fmt: skip
    result["deployments"][1] = deployment("mooncake", 3, 51.6, failing=True)
    text = matrix_markdown(result)
    assert "1 fault(s) FAILED" in text and "FAIL: 1 wrong, 0 hung, 0 unclear, held 0 / 0 / 0" in text


def test_columns_that_are_zero_in_every_row_and_an_all_pass_verdict_are_said_once_above_the_table():
    faults = [dict(_fault("none", failed=0), passed=True), dict(_fault(), passed=True)]
    result = {"profile": Profile().__dict__, "date": "2026-12-06", "commit": "abc1234", "wall_s": 600,
              "deployments": [{"transport": "zmq", "prefills": 1, "faults": faults}]}  # fmt: skip
    caption, _, header, _, *rows = markdown(result).splitlines()
    assert caption.endswith(f"; {QUIET_SENTENCE}; every fault passed.")
    assert "wrong" not in header and "held" not in header and "verdict" not in header
    assert rows[1] == "| zmq, 1 prefill | stall | 8 of 10 (8) | 2 | x1.010 | +0, +1 | 0.4 s |"
    faults[1]["slots_held"] = 1
    assert "| slots / rows / rooms held |" in markdown(result) and QUIET_SENTENCE not in markdown(result)


def _run(profile: str, out: Path, timeout_s: float) -> tuple[subprocess.CompletedProcess, dict]:
    done = subprocess.run([sys.executable, str(BENCHMARK / "fault_load.py"), "--profile", profile, "--out", str(out)],
                          capture_output=True, text=True, timeout=timeout_s)  # fmt: skip
    print(done.stdout[-6000:], done.stderr[-3000:])
    path = out / "fault_load.json"
    assert path.exists(), "the run wrote no result"
    return done, json.loads(path.read_text())


@pytest.mark.server
def test_aborts_a_stalled_prefill_and_reset_connections_under_load_leave_no_wrong_answer_and_nothing_held(tmp_path):
    """The default tier's representative of the fault matrix and the soak (`--profile smoke`): a `lynx`
    pair on a slow link, bench_serving's load through the router, client aborts at each request state,
    the prefill's scheduler frozen past the no-progress timeout, the KV connections reset; then one
    soak round, a load with aborts and a request of each other kind beside it."""
    done, result = _run("smoke", tmp_path, 1800)
    (deployment,) = result["deployments"]
    faults = {f["fault"]: f for f in deployment["faults"]}
    assert list(faults) == ["none", "abort", "stall", "drop"]
    for f in faults.values():
        assert f["passed"], f
        assert f["answered"] > 0 and f["drafted"] == f["answered"], f"every answer drafted on its anchor: {f}"
    assert faults["none"]["answered"] == faults["abort"]["answered"] == faults["none"]["requests"]
    assert {a["state"] for a in faults["abort"]["note"]["aborted"]} == set(ABORT_STATES)
    assert faults["stall"]["failed"] > 0, "the stall must catch transfers on the wire"
    assert any("no progress" in text for text in faults["stall"]["reasons"]), faults["stall"]["reasons"]
    assert faults["drop"]["note"]["connections_reset"] > 0
    soak = deployment["soak"]
    (round_,) = soak["per_round"]
    assert soak["passed"] and round_["passed"], round_
    assert soak["other_kinds"]["answered"] == len(KINDS) and soak["other_kinds"]["wrong"] == 0, soak["other_kinds"]
    assert soak["other_kinds"]["tokens_judged"] > 0
    assert done.returncode == 0


@pytest.mark.server
@pytest.mark.extended
def test_the_whole_fault_matrix_under_load_passes_on_both_transports_with_one_and_three_prefills(tmp_path):
    done, result = _run("full", tmp_path, 3 * 3600)
    assert [(d["transport"], d["prefills"]) for d in result["deployments"]] == PROFILES["full"].deployments()
    assert all(f["passed"] for d in result["deployments"] for f in d["faults"])
    assert done.returncode == 0


def test_the_soak_slope_is_least_squares_per_hour_after_the_warm_up_round():
    assert slope_per_hour([(0, 10.0), (1800, 15.0), (3600, 20.0)]) == 10.0
    assert slope_per_hour([(0, 5.0)]) is None
    rounds = [dict(_fault("abort", failed=0, requests=10, answered=10), passed=True, at_s=t, rss_mib=v,
                   note={"aborted": [{}, {}, {}]}) for t, v in ((600, 900.0), (1200, 1000.0), (1800, 1000.0), (2400, 1000.0))]  # fmt: skip
    summary = soak_summary(rounds)
    assert summary["rss_slope_mib_per_hour"] == 0.0, "the warm-up round's growth is not a slope"
    assert (summary["rounds"], summary["requests"], summary["aborted"], summary["minutes"]) == (4, 40, 12, 40.0)
    assert summary["passed"]
    rounds[2]["passed"] = False
    assert not soak_summary(rounds)["passed"]


def test_the_table_ends_with_the_soak_line():
    rounds = [dict(_fault("abort", failed=0), passed=True, at_s=60.0 * i, rss_mib=1000.0 + i, note={"aborted": [{}]})
              for i in range(1, 4)]  # fmt: skip
    deployment = {"transport": "zmq", "prefills": 1, "faults": [], "soak": soak_summary(rounds)}
    result = {"profile": Profile().__dict__, "date": "2026-12-06", "commit": "abc1234", "wall_s": 600,
              "deployments": [deployment]}  # fmt: skip
    line = markdown(result).rstrip().splitlines()[-1]
    assert line.startswith("Soak (zmq, 1 prefill): 3 rounds in 3 min, 30 requests: 24 answered")
    assert "1001 -> 1003 MiB, slope 60.0 MiB/hour: pass." in line
    one = {**deployment, "soak": soak_summary(rounds[:1])}
    line = markdown({**result, "deployments": [one]}).rstrip().splitlines()[-1]
    assert "1 round in 1 min" in line and line.endswith("1001 -> 1001 MiB, no slope (one round): pass."), line


def test_the_single_request_table_gives_each_scenarios_counts_and_reasons_in_one_cell():
    rows = [{"fault": "a stall", "requests": 1, "answered": 0, "drafted": 0, "aborted": 0, "failed": 1,
             "reasons": ["Decode transfer failed for request rank=0 with exception KVTransferError(bootstrap_room=7): "
                         "made no progress\nfor 8s | room 7"], "wrong": 0, "tokens_judged": 0, "slots_held": 0},
            {"fault": "a burst", "requests": 3, "answered": 3, "drafted": 3, "aborted": 0, "failed": 0, "reasons": [],
             "wrong": 0, "tokens_judged": 24, "slots_held": 0}]  # fmt: skip
    result = {"date": "2026-12-06", "commit": "abc1234", "link_gbps": 0.015, "timeout_s": 8, "pool_tokens": 4096,
              "rows": rows}  # fmt: skip
    table = single_markdown(result)
    assert table.startswith("2026-12-06, commit abc1234: a 0.015 Gbit/s link, no-progress timeout 8 s, a 4,096-slot")
    assert '| a stall | 1 | 0 (0) | 0 | 1: "made no progress for 8s / room 7" | 0 (0) | 0 |' in table
    assert "| a burst | 3 | 3 (3) | 0 | 0 | 0 (24) | 0 |" in table


def test_a_deployment_passes_only_with_every_fault_run_and_passed_and_no_error():
    profile = Profile(faults=("stall",))
    faults = [dict(_fault("none", failed=0), passed=True), dict(_fault(), passed=True)]
    assert passed_deployment({"faults": faults}, profile)
    assert not passed_deployment({"faults": faults[:1]}, profile), "a fault that never ran is no pass"
    assert not passed_deployment({"faults": faults, "error": "ServerStartError: ..."}, profile)
    soaking = Profile(faults=("stall",), soak_minutes=1.0)
    assert not passed_deployment({"faults": faults}, soaking), "an asked soak that never ran is no pass"
    assert passed_deployment({"faults": faults, "soak": {"passed": True}}, soaking)


@pytest.mark.server
@pytest.mark.extended
def test_an_hour_of_load_with_client_aborts_answers_exactly_and_keeps_memory_and_slots_flat(tmp_path):
    done, result = _run("soak", tmp_path, 2 * 3600)
    (deployment,) = result["deployments"]
    soak = deployment["soak"]
    print(f"soak: {soak['rounds']} rounds, memory slope {soak['rss_slope_mib_per_hour']} MiB/hour")
    assert soak["minutes"] >= 60 and soak["answered"] > 0
    assert soak["passed"] and soak["wrong"] == soak["hung"] == soak["slots_held"] == soak["rooms_held"] == 0
    assert done.returncode == 0


def test_a_run_added_to_a_result_replaces_the_deployments_it_reran_and_refuses_other_settings():
    from fault_load import merged

    def deployment(transport, prefills, commit):
        return {"transport": transport, "prefills": prefills, "commit": commit, "date": "2026-12-06", "wall_s": 100,
                "faults": []}  # fmt: skip

    earlier = merged(None, Profile(), [deployment("zmq", 1, "aaa"), deployment("zmq", 3, "aaa")])
    result = merged(earlier, Profile(transports=("mooncake",), prefills=(3,)),
                    [deployment("mooncake", 3, "bbb"), deployment("zmq", 3, "bbb")])  # fmt: skip
    assert [(d["transport"], d["prefills"], d["commit"]) for d in result["deployments"]] == [
        ("zmq", 1, "aaa"), ("mooncake", 3, "bbb"), ("zmq", 3, "bbb")]  # fmt: skip
    assert result["profile"]["transports"] == ["mooncake", "zmq"] and result["profile"]["prefills"] == [1, 3]
    assert (result["commit"], result["wall_s"]) == ("aaa, bbb", 300)
    with pytest.raises(SystemExit, match="settings differ"):
        merged(result, Profile(rate=2.0), [])


def _reply(tokens, drafted=2, finish="length"):
    return {"output_ids": list(tokens), "meta_info": {
        "finish_reason": {"type": finish}, "lynx": {"speculative_tokens": drafted},
        "output_top_logprobs": [[[-0.1, t, None], [-3.0, t + 1, None]] for t in tokens]}}  # fmt: skip


def test_the_other_kinds_each_send_one_seeded_prompt_with_their_parameters():
    from faults.mixed import bodies

    items = bodies(seed=7, vocab=49152, input_tokens=64, output_tokens=16)
    assert [kind for kind, _ in items] == list(KINDS) and bodies(7, 49152, 64, 16) == items
    assert len({tuple(body["input_ids"]) for _, body in items}) == len(KINDS), "a new prompt per kind"
    for kind, body in items:
        assert len(body["input_ids"]) == 64 and body["top_logprobs_num"] == 2
        assert body["sampling_params"] == {"max_new_tokens": 16, "temperature": 0, **KINDS[kind]}
    assert bodies(8, 49152, 64, 16) != items


def test_the_other_kinds_are_judged_against_the_references_answer_and_failures_keep_their_reason():
    from faults.mixed import bodies, judge, passed, send

    items = bodies(seed=1, vocab=1000, input_tokens=8, output_tokens=4)[:3]
    asked = []

    def post(url, body, timeout=600.0):
        asked.append(url)
        if url.startswith("http://router") and body["sampling_params"].get("repetition_penalty"):
            raise OSError("connection refused")
        wrong = url.startswith("http://router") and "frequency_penalty" in body["sampling_params"]
        return _reply([50, 60, 99 if wrong else 70, 80])

    results = send(post, None, "http://router", "http://reference", items, timeout=5)
    verdict = judge(results, post, "http://reference")
    assert asked.count("http://reference/generate") == 2, "the reference is asked only for answered requests"
    assert verdict["requests"] == 3 and verdict["answered"] == 2 and verdict["drafted"] == 2
    assert verdict["reasons"] == ["repetition-penalty: OSError: connection refused"]
    assert verdict["wrong"] == 1 and verdict["tokens_judged"] == 8, verdict
    assert not passed(verdict, 3)
    same = judge(send(lambda url, body, timeout=600.0: _reply([5, 6, 7, 8]), None, "http://r", "http://ref", items, 5),
                 post, "http://ref")  # fmt: skip
    assert same["wrong"] == 0 and same["answered"] == 3 and passed(same, 3)


def test_a_logit_bias_goes_to_the_pair_directly_and_an_error_text_is_its_reason():
    from faults.mixed import DIRECT, bodies, judge, send

    items = [item for item in bodies(seed=1, vocab=1000, input_tokens=8, output_tokens=4) if item[0] in ("greedy", *DIRECT)]
    routed = []

    def post(url, body, timeout=600.0):
        routed.append(url)
        return _reply([1, 2, 3, 4])

    verdict = judge(send(post, lambda body: "Decode transfer failed: lost", "http://router", "http://ref", items, 5),
                    post, "http://ref")  # fmt: skip
    assert routed.count("http://router/generate") == 1, "only the greedy kind goes through the router"
    assert verdict["reasons"] == ["logit-bias: Decode transfer failed: lost"] and verdict["answered"] == 1


def test_the_pd_soak_sentence_gives_each_modes_counts_and_lynxs_judging():
    def run(mode, **extra):
        return {"mode": mode, "requests": 20, "answered": 18, "aborted": 2, "errors": [], "seconds": 30.4,
                "kv_slots_leaked": 0, "rooms_left": 0, "cpu_s_per_request": {"prefill": 1.5, "decode": 0.25},
                "rss_growth_mib": {"prefill": 10.0, "decode": 4.4}, **extra}  # fmt: skip

    judged = {"answers": 18, "tokens_judged": 216, "equal": 17, "near_ties": 1, "wrong": 1}
    text = pd_soak_markdown({"date": "2026-12-06", "commit": "abc1234", "runs": [run("int8"), run("lynx", judged=judged)],
                             "lynx_minus_int8_cpu_s_per_request": {"prefill": -0.01, "decode": 0.048}})  # fmt: skip
    assert text.startswith("2026-12-06, commit abc1234: `int8`: 18 of 20 answered and 2 client aborts in 30 s, no error")
    assert "17 of 18 `lynx` answers equal `int8`'s (216 tokens judged, 1 near tie, 1 wrong)." in text
    assert "-0.010 s on the prefill, +0.048 s on the decode." in text
