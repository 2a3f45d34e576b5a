"""Every --lynx-mode on a real prefill/decode pair behind SGLang's router, against exact references.

References (see `pd_scenarios` for the deployments and requests):

* ``bf16`` mode equals a single (non-disaggregated) server token for token;
* ``int8`` mode equals a single server with `--lynx-loopback --lynx-mode
  int8`, which round-trips each prompt's KV through the int8 wire format
  in-process: what decode must compute if the transfer is right;
* ``lynx`` mode (anchor first, speculate, verify, roll back) equals ``int8``
  mode (same 8-bit KV once verified); with the ``2+6`` preset (a 2-bit
  anchor, another 8-bit grid) a single server round-tripping the KV through
  2+6; with the ``bf16-exact`` preset ``bf16`` mode. The verify pass adds the same numbers in a different
  order than step-by-step decoding, so where the two part, the parting token
  must be the reference's second choice within `NEAR_TIE_GAP`
  (`lynx_testing.exactness`), and the tokens after it must equal the
  reference continued from lynx's prefix (`pd_judging`); the summary line
  counts equal answers, near ties with their gaps and wrong answers.
"""

from __future__ import annotations

import json

import pytest
from lynx_testing.exactness import compare_sampled, sampling_pit
from lynx_testing.judge import Tally
from pd_judging import assert_greedy_answers_equal, judge_seeded, top_logprobs
from pd_scenarios import DEPLOYMENTS

pytestmark = pytest.mark.server

@pytest.fixture(scope="module")
def bodies(pd_bodies):
    return pd_bodies


@pytest.fixture(scope="module")
def runs(pd_runs):
    """The session's deployments (conftest), shared with `test_pd_request_types`."""
    return pd_runs


def _ids(answers) -> list[list[int]]:
    return [a["output_ids"] for a in answers]


def test_openai_chat_completion_through_the_router(runs):
    (answer,) = runs["lynx"].outputs["openai"]
    assert "Paris" in answer["text"] and answer["finish_reason"] == "stop"


def test_bf16_mode_equals_single_server_exactly(runs):
    assert _ids(runs["bf16"].outputs["greedy"]) == _ids(runs["single"].outputs["greedy"])


def test_int8_mode_equals_single_server_on_int8_roundtripped_kv(runs):
    assert _ids(runs["int8"].outputs["greedy"]) == _ids(runs["single-int8-loopback"].outputs["greedy"])


@pytest.mark.extended
def test_int4_mode_equals_single_server_on_int4_roundtripped_kv(runs):
    """int8's path with the anchor-only preset; the default tier compares int8 (above)."""
    assert _ids(runs["int4"].outputs["short"]) == _ids(runs["single-int4-loopback"].outputs["short"])


@pytest.mark.extended
def test_mooncake_transport_moves_exactly_the_zeromq_transports_kv(runs):
    """`int8` over Mooncake against ZeroMQ; the default tier's Mooncake pair is `lynx-mooncake` (below)."""
    assert _ids(runs["int8-mooncake"].outputs["greedy"]) == _ids(runs["int8"].outputs["greedy"])


@pytest.mark.extended
@pytest.mark.parametrize("mode,suite", [("bf16", "greedy"), ("int4", "short")])
def test_every_mode_over_mooncake_equals_zeromq(runs, mode, suite):
    """`lynx` over Mooncake is compared above; the other modes here."""
    assert _ids(runs[f"{mode}-mooncake"].outputs[suite]) == _ids(runs[mode].outputs[suite])


@pytest.mark.parametrize(
    "lynx,reference",
    [
        ("lynx", "int8"),
        ("lynx-2+6-page16", "single-2+6-loopback"),
        pytest.param("lynx-bf16-exact", "bf16", marks=pytest.mark.extended),
        ("lynx-mooncake", "int8"),
    ],
)
def test_lynx_mode_greedy_output_equals_full_precision_reference(runs, lynx, reference):
    assert_greedy_answers_equal(runs[reference].outputs["greedy"], runs[lynx].outputs["greedy"], f"{lynx} vs {reference}",
                                runs.continuation(reference))  # fmt: skip


def _metrics(answers) -> list[dict]:
    return [a["meta_info"]["lynx"] for a in answers]


def test_speculation_really_runs_and_mostly_accepts(runs):
    metrics = _metrics(runs["lynx"].outputs["greedy"])
    assert all(m["mode"] == "lynx" for m in metrics)
    drafted, accepted = (sum(m[k] for m in metrics) for k in ("speculative_tokens", "accepted_tokens"))
    assert drafted > 0 and accepted > drafted / 2, f"{accepted} of {drafted} drafted tokens accepted"
    for m in metrics:
        assert m["anchor_ready_s"] <= m["residual_ready_s"]
        assert 0 <= m["accepted_tokens"] <= m["speculative_tokens"]
    print(f"\nlynx metrics: {metrics}")


def test_prometheus_exports_lynx_counters(runs):
    text = runs["lynx"].decode_metrics
    for name in ("lynx:speculative_tokens_total", "lynx:accepted_tokens_total", "lynx:rollbacks_total",
                 "lynx:anchor_ready_seconds_bucket", "lynx:verify_seconds_count"):  # fmt: skip
        assert name in text, name
    spec = _samples(text, "lynx:speculative_tokens_total")
    assert spec and spec[0][1] > 0


def _samples(text: str, name: str) -> list[tuple[str, float]]:
    """Every sample of `name` in Prometheus text: its label set as written, and its value."""
    found = []
    for line in text.splitlines():
        if line.split("{")[0].split(" ")[0] == name:
            head, value = line.rsplit(" ", 1)
            found.append((head[len(name):], float(value)))
    return found


def _metric_total(text: str, name: str) -> float:
    """The sum of every sample of `name` (all label sets) in Prometheus text."""
    return sum(value for _, value in _samples(text, name))


def test_sglangs_transfer_metrics_count_the_bytes_lynx_sends(runs, model_path):
    """`sglang:kv_transfer_total_mb` on the prefill carries each Lynx transfer with the bytes it put on
    the wire (every stream and the metadata as encoded: about 0.53 of the BF16 KV at the int8 preset),
    where SGLang's own count is the pool's bytes of whole tokens, a multiple of the BF16 bytes of one
    token's KV over all layers."""
    text = runs["lynx"].prefill_metrics
    transfers = _metric_total(text, "sglang:kv_transfer_total_mb_count")
    wire_bytes = _metric_total(text, "sglang:kv_transfer_total_mb_sum") * 2**20  # exact: MB are bytes / 2**20
    config = json.loads((model_path / "config.json").read_text())
    head_dim = config["hidden_size"] // config["num_attention_heads"]
    pool_bytes_per_token = config["num_hidden_layers"] * 2 * config["num_key_value_heads"] * head_dim * 2
    print(f"\nprefill: {transfers:.0f} transfers observed, {wire_bytes:.0f} bytes on the wire "
          f"({wire_bytes / max(transfers, 1) / 2**20:.2f} MB each); pool bytes per token {pool_bytes_per_token}")
    assert transfers > 0 and wire_bytes == int(wire_bytes)
    assert int(wire_bytes) % pool_bytes_per_token != 0, "the metric counts the pool's bytes of whole tokens"


def _stage_counts(text: str) -> dict[str, float]:
    """`sglang:per_stage_req_latency_seconds` observations per stage, from Prometheus text."""
    counts: dict[str, float] = {}
    for labels, value in _samples(text, "sglang:per_stage_req_latency_seconds_count"):
        if 'stage="' in labels:
            stage = labels.split('stage="', 1)[1].split('"', 1)[0]
            counts[stage] = counts.get(stage, 0.0) + value
    return counts


def test_sglangs_pd_stage_latencies_and_queue_gauges_carry_lynx_transfers(runs):
    prefill, decode = runs["lynx"].prefill_metrics, runs["lynx"].decode_metrics
    prefill_stages, decode_stages = _stage_counts(prefill), _stage_counts(decode)
    print(f"\nper-stage observations: prefill {prefill_stages}, decode {decode_stages}")
    assert prefill_stages.get("prefill_transfer_kv_cache", 0) > 0
    assert decode_stages.get("decode_bootstrap", 0) > 0 and decode_stages.get("decode_transferred", 0) > 0
    for name in ("sglang:num_prefill_bootstrap_queue_reqs", "sglang:num_prefill_inflight_queue_reqs"):
        assert name in prefill, name
    for name in ("sglang:num_decode_prealloc_queue_reqs", "sglang:num_decode_transfer_queue_reqs"):
        assert name in decode, name


def test_two_bit_anchor_forces_rollbacks_and_stays_exact(runs):
    metrics = _metrics(runs["lynx-2+6-page16"].outputs["greedy"])
    assert sum(m["rollbacks"] for m in metrics) > 0
    assert sum(m["accepted_tokens"] for m in metrics) < sum(m["speculative_tokens"] for m in metrics)
    print(f"\nlynx 2+6 metrics: {metrics}")


def test_stop_conditions_inside_the_speculative_window_match_full_precision(runs):
    references = runs["int8"].outputs["stops"]
    answers = runs["lynx"].outputs["stops"]
    assert_greedy_answers_equal(references, answers, "stops", runs.continuation("int8"))
    for ref, answer in zip(references, answers):
        if ref["output_ids"] == answer["output_ids"]:
            assert answer["text"] == ref["text"]
            assert answer["meta_info"]["finish_reason"] == ref["meta_info"]["finish_reason"]
    assert answers[0]["meta_info"]["completion_tokens"] == 5  # max_new_tokens counts verified tokens


def test_seeded_sampling_equals_full_precision_sampling_in_two_runs(runs, bodies, model_path):
    """Seeded temperature sampling: two lynx runs and int8 mode draw the same tokens for
    the same seed, except where two tokens tie after the shared noise (the verify pass
    and step-by-step decoding round the KV differently, and how many tokens a run
    verifies depends on when its residual lands)."""
    vocab = json.loads((model_path / "config.json").read_text())["vocab_size"]
    tally = Tally()
    for run in ("sampling", "sampling-again"):
        answers = runs["lynx"].outputs[run]
        assert sum(m["speculative_tokens"] for m in _metrics(answers)) > 0
        for i, (body, ref, answer) in enumerate(zip(bodies["sampling"], runs["int8"].outputs["sampling"], answers,
                                                    strict=True)):  # fmt: skip
            tally.add(judge_seeded(ref, answer, body["sampling_params"]["sampling_seed"], vocab, i))
    print(f"\nsampling vs int8: {tally.summary()}")
    assert tally.ok, tally.partings


def _sampled_pairs(runs, bodies, suite: str, answers, model_path):
    """(int8 reference, lynx answer, `compare_sampled` result) per request; asserts each is exact."""
    vocab = json.loads((model_path / "config.json").read_text())["vocab_size"]
    for body, ref, answer in zip(bodies[suite], runs["int8"].outputs[suite], answers, strict=True):
        seed = body["sampling_params"]["sampling_seed"]
        result = compare_sampled(ref["output_ids"], answer["output_ids"], top_logprobs(ref), seed, vocab)
        assert result.ok, result.detail
        yield ref, answer, result


@pytest.mark.extended
def test_sampled_tokens_follow_the_full_precision_distribution(runs, bodies, model_path):
    """Many seeds, a short prompt, 4 sampled tokens each (3 drafted on the anchor, then
    verified): every lynx token, mapped through the full-precision distribution at its
    position (int8 mode's log-probabilities for the same prefix), must give uniform values.
    (The default tier's sampled-decoding check is the seeded equality above: each token equal
    to full precision's for its seed, hence distributed like it.)"""
    import random

    from scipy.stats import kstest

    answers = runs["lynx-distribution"].outputs["distribution"]
    assert sum(m["speculative_tokens"] for m in _metrics(answers)) > 0
    rng = random.Random(0)
    values, tied = [], 0
    for ref, answer, result in _sampled_pairs(runs, bodies, "distribution", answers, model_path):
        same_prefix = len(answer["output_ids"]) if result.verdict == "equal" else result.position + 1
        tied += result.verdict == "near_tie"
        tokens = answer["output_ids"][:same_prefix]
        values += sampling_pit(tokens, top_logprobs(ref)[:same_prefix], rng.random)
    test = kstest(values, "uniform")
    print(f"\nsampled distribution: {len(values)} tokens, KS p={test.pvalue:.3f}, near-ties {tied}")
    assert test.pvalue > 0.001, f"lynx samples do not follow full-precision probabilities (KS p={test.pvalue:.2g})"


def test_concurrent_requests_in_mixed_phases_are_exact(runs, bodies):
    reference = {chat_text_key(b): a for b, a in _pairs(runs["int8"], bodies)}
    answers = runs["lynx"].outputs["concurrent"]
    expected = [reference[chat_text_key(b)] for b in bodies["concurrent"]]
    assert_greedy_answers_equal(expected, answers, "concurrent", runs.continuation("int8"))


def chat_text_key(body: dict) -> str:
    return json.dumps(body, sort_keys=True)


def _pairs(run, bodies):
    for suite in ("greedy", "stops"):
        yield from zip(bodies[suite], run.outputs[suite])


@pytest.mark.parametrize("name", ["lynx-page64-radix", pytest.param("lynx-radix", marks=pytest.mark.extended)])
def test_decode_radix_cache_never_shares_anchor_precision_kv(runs, name):
    """A decodes on its anchor while B (same prompt) arrives: B may not reuse A's
    partial-precision prompt KV. C, after A was verified, reuses it. The default
    tier's pair keeps KV pages of 64 (`test_pd_shapes`), the extended tier's pages of 1."""
    a, b, c = runs[name].outputs["radix"]
    prompt = a["meta_info"]["prompt_tokens"]
    assert a["meta_info"]["lynx"]["transferred_tokens"] == prompt
    assert b["meta_info"]["lynx"]["transferred_tokens"] == prompt
    assert c["meta_info"]["lynx"]["transferred_tokens"] < prompt
    reference = runs["int8"].outputs["greedy"][1]
    assert_greedy_answers_equal([reference] * 3, [a, b, c], "radix A/B/C vs int8", runs.continuation("int8"))


@pytest.mark.parametrize(
    "name",
    [pytest.param(d.name, marks=[pytest.mark.extended] if d.extended else []) for d in DEPLOYMENTS if not d.single],
)
def test_decode_server_frees_every_kv_slot(runs, name):
    run = runs[name]
    assert run.free_after["kv_free_slots"] == run.free_before["kv_free_slots"]
    assert run.free_after["req_rows_free"] == run.free_before["req_rows_free"]
