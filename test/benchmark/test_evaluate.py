"""The evaluation command: its pure pieces, and its smallest configuration end to end on real PD pairs."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest

BENCHMARK = Path(__file__).resolve().parents[2] / "benchmark"
if str(BENCHMARK) not in sys.path:
    sys.path.insert(0, str(BENCHMARK))

from evaluation import accuracy, claims, comparisons, estimates, likelihood, runner, speed  # noqa: E402
from evaluation.link import ShapedLoopback  # noqa: E402
from evaluation.plan import PROFILES, VARIANTS  # noqa: E402
from lynx_deploy.estimate import GEOMETRIES  # noqa: E402

import evaluate  # noqa: E402


class _Recorder:
    def __init__(self):
        self.calls = []

    def __call__(self, argv, **kwargs):
        self.calls.append(argv)
        return subprocess.CompletedProcess(argv, 0, "", "")


def test_link_shapes_everything_but_the_exempt_ports():
    run = _Recorder()
    ShapedLoopback(run=run).set_rate(0.02, exempt_ports=[8000])
    commands = [" ".join(c) for c in run.calls]
    assert commands[0] == "tc qdisc del dev lo root"
    assert "htb rate 20000000bit ceil 20000000bit" in commands[2] and "default 10" in commands[1]
    assert sum("u32 match ip sport 8000 0xffff flowid 1:20" in c for c in commands) == 1
    assert sum("u32 match ip dport 8000 0xffff flowid 1:20" in c for c in commands) == 1


def test_unshaping_only_removes_the_qdisc_and_bad_rates_are_refused():
    run = _Recorder()
    link = ShapedLoopback(run=run)
    link.set_rate(None)
    assert run.calls == [["tc", "qdisc", "del", "dev", "lo", "root"]] and link.gbps is None
    with pytest.raises(ValueError):
        link.set_rate(0.0)


def test_rates_put_the_bf16_transfer_at_the_asked_multiple_of_the_prefill():
    geometry = PROFILES["full"]()["smollm2"].geometry
    (rate,) = speed.rates_for(geometry, 1000, prefill_s=4.0, ratios=[2.0])
    assert geometry.raw_bytes(1000) * 8 / (rate * 1e9) == pytest.approx(8.0)


def test_every_variant_serves_a_known_wire_format():
    for variant in VARIANTS.values():
        assert speed.stream_bytes(PROFILES["full"]()["qwen2"].geometry, variant, 640)
        assert ("--lynx-mode" in variant.lynx_args()) != variant.stock


def test_item_comparison_uses_the_reference_near_tie_rule():
    ref = [{"item": "a", "output_ids": [1, 2, 3], "top2": [[(1, -0.1), (9, -3.0)], [(2, -0.69), (5, -0.70)],
                                                            [(3, -0.1), (4, -2.0)]], "score": 1.0}]  # fmt: skip
    tie = [{"item": "a", "output_ids": [1, 5, 7], "score": 0.0}]
    off = [{"item": "a", "output_ids": [9, 2, 3], "score": 1.0}]
    assert accuracy.compare(ref, ref)[0]["verdict"] == "equal"
    lossy = accuracy.compare(ref, tie)[0]
    assert lossy["verdict"] == "near_tie" and lossy["tokens_unchecked"] == 1, "no continuation: the rest unchecked"
    assert accuracy.compare(ref, off)[0]["verdict"] == "mismatch"


def test_an_exact_pair_judges_the_tokens_after_a_near_tie_against_the_reference_continued(monkeypatch):
    spec = {"max_new_tokens": 3}
    ref = [{"item": "a", "output_ids": [1, 2, 3], "prompt_ids": [40, 41], "spec": spec, "score": 1.0,
            "top2": [[(1, -0.1), (9, -3.0)], [(2, -0.69), (5, -0.70)], [(3, -0.1), (4, -2.0)]]}]  # fmt: skip
    asked = []

    def post(url, body):
        asked.append((url, body["input_ids"], body["sampling_params"]["max_new_tokens"]))
        return {"output_ids": [7], "meta_info": {"output_top_logprobs": [[[-0.1, 7, None], [-3.0, 2, None]]]}}

    monkeypatch.setattr(accuracy, "post_json", post)
    good = accuracy.compare(ref, [{"item": "a", "output_ids": [1, 5, 7], "score": 0.0}], lambda: "http://ref")[0]
    assert good["verdict"] == "near_tie" and good["tokens_unchecked"] == 0 and good["position"] == 1
    assert asked == [("http://ref/generate", [40, 41, 1, 5], 1)]
    bad = accuracy.compare(ref, [{"item": "a", "output_ids": [1, 5, 8], "score": 0.0}], lambda: "http://ref")[0]
    assert bad["verdict"] == "mismatch" and [p["kind"] for p in bad["partings"]] == ["near_tie", "mismatch"]
    (pair,) = comparisons.comparisons({"int8": {"items": ref}, "lynx": {"items": ref}})
    assert pair["exact"] and pair["counts"] == {"equal": 1, "near_tie": 0, "mismatch": 0}


def test_bootstrap_interval_brackets_the_mean():
    values = [0.1, 0.2, 0.3, 0.4, 0.5]
    ci = likelihood.interval(values)
    assert ci["mean"] == pytest.approx(0.3) and ci["n"] == 5
    assert 0.1 <= ci["low"] < ci["mean"] < ci["high"] <= 0.5
    assert likelihood.interval([0.2] * 4) == {"mean": 0.2, "low": 0.2, "high": 0.2, "n": 4}


def test_window_comparison_of_a_distribution_with_itself_is_zero():
    import torch

    logp = torch.log_softmax(torch.randn(6, 50), dim=-1)
    same = likelihood.compare_window(logp, logp, [1, 2, 3, 4, 5, 6])
    assert same["kl"] == 0.0 and same["delta_nll"] == 0.0 and same["top1_agree"] == 1.0


def test_claims_read_ttft_ratios_per_link_rate():
    rows = [{"variant": v, "link_gbps": 0.01, "bf16_transfer_to_prefill": 2.0, "t1_s": t}
            for v, t in (("int4", 10.0), ("int8", 13.0), ("lynx", 10.2))]  # fmt: skip
    results = {"models": {"m": {"speed": rows, "variants": {}, "comparisons": []}}, "cluster": {}}
    vs_int4, _, vs_int8, cachegen = claims.claims(results)
    assert "1 of 1 rows" in vs_int4["status"] and "1.27x" in vs_int8["status"]
    assert cachegen["status"] == "not comparable"


def test_lynx_rows_pipeline_per_layer_of_each_chunk_and_stock_rows_per_chunk():
    geometry = GEOMETRIES["smollm2-135m"]
    assert estimates.cpu_pipeline_units(geometry, 1072, stock=False) == 2 * geometry.num_layers
    assert estimates.cpu_pipeline_units(geometry, 1072, stock=True) == 2
    row = {"variant": "bf16", "model": "m", "prompt_tokens": 1072, "link_gbps": 0.02, "t1_s": 9.0,
           "bf16_transfer_to_prefill": 2.0}  # fmt: skip
    # BF16 transfer twice the prefill: streamed per layer, the TTFT is about the transfer, not their sum.
    transfer_s = geometry.raw_bytes(1072) * 8 / 0.02e9
    (check,) = estimates.check_rows(geometry, [row], transfer_s / 2, {})
    assert transfer_s < check["estimated_ttft_s"] < 1.1 * transfer_s


def test_rebuilding_from_something_that_is_not_a_run_is_refused(tmp_path, capsys):
    bad = tmp_path / "results.json"
    bad.write_text("{}")
    assert evaluate.main(["--from-json", str(bad), "--out", str(tmp_path / "out")]) == 2
    assert "not an evaluation's results.json" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


class _FakePair:
    """Stands in for a PDDeployment: records which threads started its prefill server and the
    rest, and whether it was stopped."""

    def __init__(self, fail: bool = False, fail_rest: bool = False):
        self.fail, self.fail_rest, self.stopped = fail, fail_rest, False
        self.started_by = self.prefill_started_by = None

    def start_prefill(self):
        self.prefill_started_by = threading.current_thread()
        if self.fail:
            raise RuntimeError("no memory for the KV cache")
        return self

    def start(self):
        if self.prefill_started_by is None:
            self.start_prefill()
        self.started_by = threading.current_thread()
        if self.fail_rest:
            raise RuntimeError("decode: no memory for the KV cache")
        return self

    def stop(self):
        self.stopped = True


def test_early_start_hands_over_the_started_pair_and_its_thread_outlives_it():
    made = []
    early = runner.EarlyStart(lambda: made.append(_FakePair()) or made[-1], log=lambda _: None)
    pd = early.take()
    assert pd is made[0] and pd.started_by is not threading.current_thread()
    assert pd.started_by.is_alive()  # its servers die with that thread
    early.release()
    pd.started_by.join(timeout=5)
    assert not pd.started_by.is_alive() and not pd.stopped


def test_a_failed_early_start_is_stopped_and_started_again_the_ordinary_way():
    made, logged = [], []
    early = runner.EarlyStart(lambda: made.append(_FakePair(fail=not made)) or made[-1], log=logged.append)
    pd = early.take()
    assert made[0].stopped and pd is made[1] and pd.started_by is threading.current_thread()
    assert "early start failed" in logged[0] and "no memory" in logged[0]
    early.release()


def test_an_early_prefill_server_is_handed_over_and_the_rest_starts_on_the_taking_thread():
    made = []
    early = runner.EarlyStart(lambda: made.append(_FakePair()) or made[-1], log=lambda _: None, part="prefill")
    pd = early.take()
    assert pd is made[0] and not pd.stopped
    assert pd.prefill_started_by is not threading.current_thread() and pd.prefill_started_by.is_alive()
    assert pd.started_by is threading.current_thread()  # decode server and router, once the pair before stopped
    early.release()
    pd.prefill_started_by.join(timeout=5)
    assert not pd.prefill_started_by.is_alive()


def test_when_the_rest_of_an_early_prefill_fails_to_start_the_pair_starts_again_the_ordinary_way():
    made, logged = [], []
    early = runner.EarlyStart(lambda: made.append(_FakePair(fail_rest=not made)) or made[-1], log=logged.append,
                              part="prefill")  # fmt: skip
    pd = early.take()
    assert made[0].stopped and pd is made[1] and pd.prefill_started_by is threading.current_thread()
    assert "early start failed" in logged[0] and "decode: no memory" in logged[0]
    early.release()


def test_an_early_start_of_something_else_is_refused():
    with pytest.raises(ValueError, match="'pair' or a 'prefill'"):
        runner.EarlyStart(_FakePair, log=lambda _: None, part="decode")


def test_an_early_pair_no_variant_took_is_stopped():
    pair = _FakePair()
    early = runner.EarlyStart(lambda: pair, log=lambda _: None)
    early.discard()
    assert pair.stopped
    pair.started_by.join(timeout=5)
    assert not pair.started_by.is_alive()


@pytest.mark.server
@pytest.mark.extended
def test_smallest_configuration_writes_a_full_report(tmp_path):
    """Three real PD pairs, about 4.5 minutes: the extended tier. The default tier has the
    pieces above and the TTFT sweep's real-pair run (test_ttft_sweep.py)."""
    out = tmp_path / "eval"
    command = [sys.executable, str(BENCHMARK / "evaluate.py"), "--profile", "smoke", "--models", "smollm2",
               "--variants", "int8,lynx,stock", "--out", str(out)]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=1200, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    data = json.loads((out / "results.json").read_text())
    model = data["models"]["smollm2"]
    assert not [v["error"] for v in model["variants"].values() if "error" in v]
    # The second and third pairs started while the one before answered its task items.
    assert [v["timings"]["early_start"] for v in model["variants"].values()] == ["", "pair", "pair"]
    (lynx_vs_int8,) = [c for c in model["comparisons"] if (c["reference"], c["candidate"]) == ("int8", "lynx")]
    assert lynx_vs_int8["counts"]["mismatch"] == 0 and sum(lynx_vs_int8["counts"].values()) == 1
    assert lynx_vs_int8["exact"] and lynx_vs_int8["tokens_unchecked"] == 0
    assert {r["variant"] for r in model["speed"]} == {"int8", "lynx", "stock"}
    assert all(r["t1_s"] > 0 and r["bf16_transfer_to_prefill"] > 0 for r in model["speed"])
    assert set(model["likelihood"]["summary"]) == set(likelihood.CODECS)
    assert len(model["estimator_check"]) == 3 and data["cluster"]["table"][0]["kind"] == "estimate"
    report = (out / "report.md").read_text()
    for heading in ("Claims side by side", "Accuracy on long-context tasks", "log-likelihood", "Speed",
                    "Estimator against the measured rows", "Where the time went", "Cluster scale"):  # fmt: skip
        assert heading in report
    assert all((out / name).stat().st_size > 0 for name in ("ttft_smollm2.png", "likelihood.png", "estimate.png"))


def test_the_next_variant_starts_early_as_its_plan_allows_and_the_next_models_first_prefill_after_the_last(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(runner, "prepare", lambda name, log=None: tmp_path / name)
    plans = PROFILES["full"]()
    smollm2, qwen2 = plans["smollm2"], plans["qwen2"]
    variants = [VARIANTS["int8"], VARIANTS["lynx"]]

    def following(plan, index, next_plan):
        chosen = runner._following(plan, variants, index, tmp_path / plan.model, tmp_path, next_plan, print)
        if chosen is None:
            return None
        make, part = chosen
        pd = make()  # made, not started
        return pd.prefill.log_path.parent.name, part

    assert following(smollm2, 0, qwen2) == ("smollm2-lynx", "pair")
    assert following(qwen2, 0, None) == ("qwen2-lynx", "prefill")
    assert following(smollm2, 1, qwen2) == ("qwen2-int8", "prefill")  # the last variant hands over
    assert following(qwen2, 1, None) is None
    no_early = dataclasses.replace(smollm2, early_start="")
    assert following(no_early, 0, qwen2) is None
    assert following(smollm2, 1, no_early) is None
