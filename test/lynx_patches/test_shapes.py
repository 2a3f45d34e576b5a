"""Deployment shapes on the lynx_cpu platform: page sizes above 1 and tensor parallelism 2.

One real SGLang server with --lynx per shape, in fp32 (model and KV cache), so
the only arithmetic differences left are the reduction orders the shape
changes. Default tier, one start per shape:

* page size 16: every greedy token equals transformers' fp32 greedy decoding
  (near-tie rule, `lynx_testing.exactness`), for prompts that fill whole
  pages and prompts whose last page is partial; a repeated prompt hits the
  radix cache in whole pages and answers as the first time (after a near tie,
  against the server continued from the repeat's prefix);
* TP 2 on SmolLM2: 9 query and 3 KV heads, which SGLang pads with zero heads
  to 12 and 4 so that each rank holds 6 and 2; same check.

Extended tier (`--extended`): page sizes 16 and 64 and TP 2 with pages, each
against a page size 1, TP 1 server token for token; Qwen2 (14 query heads
over 2 KV heads, one per rank, nothing padded) at TP 2 against TP 1. Servers
run one at a time: a reference's outputs are recorded and its server stopped
before the candidate starts, so after a near tie the rest of a candidate is
judged against transformers' fp32 greedy decoding continued from its prefix.
"""

from __future__ import annotations

import pytest
from lynx_testing.exactness import compare_greedy_resynced
from lynx_testing.judge import Answer, Tally, judge_pair
from lynx_deploy.server import SGLangServer

pytestmark = pytest.mark.server

MAX_NEW_TOKENS = 24
FP32 = ("--dtype", "float32")
QUESTIONS = (
    "What is the capital of France?",
    "List three prime numbers greater than 50.",
    "Explain photosynthesis in two sentences.",
)
# Raw essay prefixes: 64 tokens fill whole pages of 16 and of 64; 150 leave a partial last page.
ESSAY_LENGTHS = (64, 150)


def shape_prompts(model_path) -> list[list[int]]:
    """Token ids: chat questions (about 40 tokens) and raw essay prefixes of `ESSAY_LENGTHS`."""
    from lynx_testing.prompts import chat_prompt, essays
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_path))
    chats = [
        tokenizer.encode(chat_prompt(tokenizer, q), add_special_tokens=False)
        for q in QUESTIONS
    ]
    essay = tokenizer.encode(essays()[0][1], add_special_tokens=False)
    return chats + [essay[:n] for n in ESSAY_LENGTHS]


def generate(
    server: SGLangServer, ids: list[int], max_new_tokens: int = MAX_NEW_TOKENS
) -> dict:
    """Greedy continuation with per-step top-2: ``{"tokens", "top2", "cached"}``."""
    answer = server.post_json(
        "/generate",
        {
            "input_ids": ids,
            "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0},
            "return_logprob": True,
            "top_logprobs_num": 2,
        },
    )
    meta = answer["meta_info"]
    top2 = [
        tuple((int(t), float(lp)) for lp, t, *_ in step[:2])
        for step in meta["output_top_logprobs"]
    ]
    return {
        "tokens": answer["output_ids"],
        "top2": top2,
        "cached": meta["cached_tokens"],
    }


def start(model_path, args, log_path) -> SGLangServer:
    return SGLangServer(model_path, ["--lynx", *FP32, *args], log_path=log_path)


@pytest.fixture(scope="module")
def prompts(model_path) -> list[list[int]]:
    return shape_prompts(model_path)


@pytest.fixture(scope="module")
def transformers_fp32(model_path):
    from lynx_testing.hf_reference import HFReference

    return HFReference(model_path, dtype="float32")


def assert_every_token_equals_transformers(server, reference, prompts) -> None:
    tokens, ties = 0, 0
    for ids in prompts:
        served = generate(server, ids)["tokens"]
        result = compare_greedy_resynced(
            served, lambda prefix, n, ids=ids: reference.greedy(ids + prefix, n)
        )
        assert result.ok, f"prompt of {len(ids)} tokens: {result.problem.detail}"
        assert len(served) > 3
        tokens, ties = tokens + len(served), ties + len(result.ties)
    print(
        f"\n{tokens} tokens over {len(prompts)} prompts, {ties} partings at a near-tie"
    )


# Class-scoped: a shape's server stops when its class is done, so one runs at a time.
@pytest.fixture(scope="class")
def page16_server(model_path, server_logs):
    log = server_logs / "shape-page16.log"
    with start(model_path, ["--page-size", "16"], log) as server:
        yield server


@pytest.fixture(scope="class")
def tp2_server(model_path, server_logs):
    log = server_logs / "shape-tp2.log"
    with start(model_path, ["--tp-size", "2"], log) as server:
        yield server


class TestPageSize16:
    def test_server_reports_page_size_16(self, page16_server):
        assert page16_server.get_json("/server_info")["page_size"] == 16

    def test_every_greedy_token_equals_transformers_in_fp32(
        self, page16_server, transformers_fp32, prompts
    ):
        assert_every_token_equals_transformers(
            page16_server, transformers_fp32, prompts
        )

    def test_repeated_prompt_hits_the_radix_cache_in_whole_pages(
        self, page16_server, prompts
    ):
        def served(prompt, n):
            answer = generate(page16_server, prompt, n)
            return answer["tokens"], answer["top2"]

        tally = Tally()
        for ids in prompts:
            first, again = generate(page16_server, ids), generate(page16_server, ids)
            # Every whole page before the last prompt token (which is always recomputed).
            assert again["cached"] == (len(ids) - 1) // 16 * 16 > 0
            tally.add(judge_pair(_answer(ids, again), _answer(ids, first), served))
        print(f"\nserved again from the cache: {tally.summary()}")
        assert tally.ok, tally.partings


class TestTensorParallel2:
    def test_server_reports_two_ranks(self, tp2_server):
        assert tp2_server.get_json("/server_info")["tp_size"] == 2

    def test_every_greedy_token_equals_transformers_in_fp32(
        self, tp2_server, transformers_fp32, prompts
    ):
        """SmolLM2's heads do not divide by 2: this runs SGLang's zero-padded head sharding."""
        assert_every_token_equals_transformers(tp2_server, transformers_fp32, prompts)


def record(server: SGLangServer, prompts) -> list[dict]:
    """Each prompt twice: once cold, once again (a radix-cache hit)."""
    return [generate(server, ids) for ids in prompts for _ in range(2)]


def _answer(ids: list[int], answer: dict) -> Answer:
    return Answer(tuple(ids), tuple(answer["tokens"]), tuple(answer["top2"]))


def assert_equal_to_reference(
    reference: list[dict], candidate: list[dict], prompts, continuation, label: str
) -> None:
    """`record`'s outputs (each prompt twice) against the reference's; after a near tie the rest
    against `continuation(ids, n)` (transformers' fp32 greedy decoding)."""
    tally = Tally()
    twice = [ids for ids in prompts for _ in range(2)]
    for index, (ids, ref, cand) in enumerate(zip(twice, reference, candidate, strict=True)):
        tally.add(judge_pair(_answer(ids, cand), _answer(ids, ref), continuation, index))
    print(f"\n{label}: {tally.summary()}")
    assert tally.ok, f"{label}: {tally.partings}"


@pytest.fixture(scope="module")
def page1_tp1_outputs(model_path, prompts, server_logs) -> list[dict]:
    with start(model_path, [], server_logs / "shape-page1-tp1.log") as server:
        return record(server, prompts)


@pytest.mark.extended
@pytest.mark.parametrize(
    "args",
    [
        ("--page-size", "16"),
        ("--page-size", "64"),
        ("--tp-size", "2", "--page-size", "16"),
    ],
    ids=["page16", "page64", "tp2-page16"],
)
def test_shape_equals_page_size_1_tp_1_token_for_token(
    model_path, prompts, server_logs, page1_tp1_outputs, transformers_fp32, args
):
    label = "-".join(args).replace("--", "")
    with start(model_path, args, server_logs / f"shape-{label}.log") as server:
        outputs = record(server, prompts)
    page = int(args[args.index("--page-size") + 1])
    assert [o["cached"] for o in outputs[1::2]] == [
        (len(ids) - 1) // page * page for ids in prompts
    ]
    assert_equal_to_reference(page1_tp1_outputs, outputs, prompts, transformers_fp32.greedy, label)


@pytest.mark.extended
def test_qwen2_tp2_equals_tp1_token_for_token(server_logs):
    from lynx_deploy.models import prepare
    from lynx_testing.hf_reference import HFReference

    path = prepare("qwen2")
    qwen_prompts = shape_prompts(path)
    # SGLang sizes the KV pool against memory available machine-wide before the
    # weights load, and refuses to start when Qwen2's 2.5 GB of fp32 weights take
    # more than 1 - fraction of it; --max-total-tokens still bounds the pool.
    memory = ["--mem-fraction-static", "0.8"]
    with start(path, memory, server_logs / "shape-qwen2-tp1.log") as server:
        reference = record(server, qwen_prompts)
    tp2 = [*memory, "--tp-size", "2"]
    with start(path, tp2, server_logs / "shape-qwen2-tp2.log") as server:
        assert server.get_json("/server_info")["tp_size"] == 2
        candidate = record(server, qwen_prompts)
    exact = HFReference(path, dtype="float32")
    assert_equal_to_reference(reference, candidate, qwen_prompts, exact.greedy, "qwen2 tp2")
