"""Deployment shapes through a real prefill/decode pair: KV page sizes above 1 and a second model family.

Default tier, one representative of each:

* pages of 64 with the decode radix cache on, in ``lynx`` mode: two prompts
  whose lengths are multiples of neither the page size nor the 64-token key
  group (partial last pages), the second sharing the first's prefix, so its
  transfer starts after the pages the decode server already holds; both equal
  ``int8`` mode at page 1 token for token (near-tie rule, and after a tie the
  reference continued from the candidate's prefix: `pd_judging`) and every
  decode KV slot comes back (the same
  pair serves `test_pd_modes`' radix sequence first);
* Qwen2.5-Coder-0.5B (Qwen2: q/k/v biases, 14 query heads over 2 KV heads) in
  ``lynx`` mode against one Qwen2 server round-tripping each prompt's KV
  through int8 (`--lynx-loopback`: what ``int8`` mode, and ``lynx`` mode once
  verified, decodes).

Extended tier (`--extended`): pages of 16 and 64 in every mode, each against
the same mode at page 1 (``lynx`` against ``int8``, with the radix cache on);
Qwen2 in ``bf16``, ``int8`` and ``int4`` pairs against one Qwen2 server
(``bf16``) or its loopback in the same mode.
"""

from __future__ import annotations

import pytest
from pd_judging import assert_greedy_answers_equal
from pd_scenarios import Run

pytestmark = pytest.mark.server


def _lynx(answer: dict) -> dict:
    return answer["meta_info"]["lynx"]


def assert_every_slot_returned(run: Run) -> None:
    assert run.free_after["kv_free_slots"] == run.free_before["kv_free_slots"]
    assert run.free_after["req_rows_free"] == run.free_before["req_rows_free"]


def assert_partial_pages_and_radix_hit(answers: list[dict], page: int) -> None:
    """The "pages" suite's two answers: partial last pages; the second reused whole cached pages."""
    first, second = answers
    prompts = [a["meta_info"]["prompt_tokens"] for a in answers]
    assert all(p % page and p % 64 for p in prompts), f"prompts of {prompts} tokens fill whole pages or key groups"
    assert _lynx(first)["transferred_tokens"] == prompts[0]
    reused = prompts[1] - _lynx(second)["transferred_tokens"]
    assert reused > 0 and reused % page == 0, f"{reused} of {prompts[1]} prompt tokens reused from the radix cache"


def test_page64_lynx_pair_with_decode_radix_cache_equals_int8_on_partial_pages(pd_runs):
    run = pd_runs["lynx-page64-radix"]
    answers = run.outputs["pages"]
    assert_partial_pages_and_radix_hit(answers, 64)
    assert sum(_lynx(a)["speculative_tokens"] for a in answers) > 0, "no request drafted on its anchor"
    assert_greedy_answers_equal(pd_runs["int8"].outputs["pages"], answers, "lynx page 64 + radix vs int8 page 1",
                                pd_runs.continuation("int8"))  # fmt: skip
    assert_every_slot_returned(run)


@pytest.mark.extended
@pytest.mark.parametrize("page", [16, 64])
@pytest.mark.parametrize("mode,suite", [("bf16", "greedy"), ("int8", "greedy"), ("int4", "short")])
def test_page_size_equals_page_1_in_the_same_mode(pd_runs, mode, suite, page):
    assert_greedy_answers_equal(pd_runs[mode].outputs[suite], pd_runs[f"{mode}-page{page}"].outputs[suite],
                                f"{mode} page {page} vs page 1", pd_runs.continuation(mode))  # fmt: skip


@pytest.mark.extended
@pytest.mark.parametrize("page", [16, 64])
def test_lynx_pages_with_decode_radix_cache_equal_int8_at_page_1(pd_runs, page):
    run = pd_runs[f"lynx-page{page}-radix"]
    assert_partial_pages_and_radix_hit(run.outputs["pages"], page)
    for suite in ("pages", "greedy"):
        references = pd_runs["int8"].outputs[suite]
        assert_greedy_answers_equal(references, run.outputs[suite], f"lynx page {page} + radix vs int8 ({suite})",
                                    pd_runs.continuation("int8"))  # fmt: skip


def test_qwen2_lynx_pair_equals_int8_round_trip_token_for_token(qwen2_runs):
    run = qwen2_runs["qwen2-lynx"]
    answers = run.outputs["brief"]
    assert all(_lynx(a)["mode"] == "lynx" for a in answers)
    assert sum(_lynx(a)["speculative_tokens"] for a in answers) > 0, "no request drafted on its anchor"
    reference = qwen2_runs["qwen2-single-int8-loopback"].outputs["brief"]
    assert_greedy_answers_equal(reference, answers, "qwen2 lynx vs int8 loopback",
                                qwen2_runs.continuation("qwen2-single-int8-loopback"))  # fmt: skip
    assert_every_slot_returned(run)


@pytest.mark.extended
@pytest.mark.parametrize(
    "mode,reference", [("bf16", "qwen2-single"), ("int8", "qwen2-single-int8-loopback"),
                       ("int4", "qwen2-single-int4-loopback")],
)  # fmt: skip
def test_qwen2_pair_equals_one_server_decoding_the_same_kv(qwen2_runs, mode, reference):
    run = qwen2_runs[f"qwen2-{mode}"]
    ids = [a["output_ids"] for a in run.outputs["brief"]]
    assert ids == [a["output_ids"] for a in qwen2_runs[reference].outputs["brief"]]
    assert_every_slot_returned(run)
