"""End to end: the README's server (real SGLang, --lynx, SmolLM2 on this CPU)."""

from __future__ import annotations

import functools

import pytest
from lynx_deploy.deployment import SERVED_MODEL
from lynx_testing.exactness import BF16_NEAR_TIE_GAP, compare_greedy, compare_greedy_resynced, settle_bf16_parting
from lynx_testing.hf_reference import HFReference
from lynx_deploy.server import SGLangServer
from openai import OpenAI

pytestmark = pytest.mark.server

PROMPTS = (
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain photosynthesis in two sentences.",
    "List three prime numbers greater than 50.",
    "Translate 'good morning' into Spanish and German.",
    "What does a compiler do?",
    "Give me a short tip for learning to cook.",
    "Summarize the plot of Romeo and Juliet in one sentence.",
)
MAX_TOKENS = 40


@pytest.fixture(scope="module")
def client(lynx_server) -> OpenAI:
    return OpenAI(base_url=f"{lynx_server.url}/v1", api_key="unused")


def _chat(client: OpenAI, prompt: str):
    reply = client.chat.completions.create(
        model=SERVED_MODEL,
        messages=[{"role": "user", "content": prompt}],
        max_tokens=MAX_TOKENS,
        temperature=0,
        extra_body={"return_prompt_token_ids": True, "return_token_ids": True},
    )
    choice = reply.choices[0]
    return choice, choice.model_extra["prompt_token_ids"], choice.model_extra["response_token_ids"]


def test_chat_completion_answers_through_openai_client(client):
    choice, _, tokens = _chat(client, "What is the capital of France? Answer in one sentence.")
    assert "Paris" in choice.message.content
    assert choice.finish_reason == "stop"
    assert 0 < len(tokens) <= MAX_TOKENS


def test_server_runs_on_the_lynx_cpu_platform(lynx_server):
    info = lynx_server.get_json("/server_info")
    assert info["device"] == "cpu"
    assert info["attention_backend"] == "torch_native"


def test_greedy_output_equals_transformers_bf16(client, model_path):
    """The README's bf16 server agrees with transformers' bf16 greedy decoding.

    bf16 logits tie often (one bf16 step at |logit| ~ 20 is 0.125 nats), so
    two correct decoders may part: the parting token must then be
    transformers' other top-2 choice at most one bf16 step behind
    (`lynx_testing.exactness.BF16_NEAR_TIE_GAP`), or transformers' fp32
    model must rank it first or within `BF16_ROUNDING_GAP` of first after the
    same tokens (`settle_bf16_parting`: rounding inside the layers moves a
    bf16 gap by up to 0.4 nats, differently per CPU). The fp32 test below
    checks every token.
    """
    reference = HFReference(model_path, dtype="bfloat16")
    exact = functools.cache(lambda: HFReference(model_path, dtype="float32"))
    verdicts = []
    for prompt in PROMPTS:
        _, prompt_ids, served = _chat(client, prompt)
        expected, top2 = reference.greedy(prompt_ids, MAX_TOKENS)
        result = settle_bf16_parting(
            compare_greedy(expected, served, top2, BF16_NEAR_TIE_GAP),
            served,
            lambda prefix: exact().next_top2(prompt_ids + prefix),
        )
        assert result.ok, f"{prompt!r}: {result.detail}"
        verdicts.append(result.verdict)
    print(f"\nbf16: {verdicts.count('equal')}/{len(PROMPTS)} equal, "
          f"{verdicts.count('near_tie')} parted at a tie")


@pytest.fixture(scope="module")
def fp32_client(model_path, server_logs):
    with SGLangServer(
        model_path,
        ["--lynx", "--served-model-name", SERVED_MODEL, "--dtype", "float32"],
        log_path=server_logs / "fp32-server.log",
    ) as server:
        yield OpenAI(base_url=f"{server.url}/v1", api_key="unused")


def test_every_greedy_token_equals_transformers_in_fp32(fp32_client, model_path):
    """In fp32 every served token is checked against transformers.

    After a parting at a near-tie transformers resumes from the served tokens
    (`compare_greedy_resynced`), so no token goes unchecked.
    """
    reference = HFReference(model_path, dtype="float32")
    tokens, ties = 0, 0
    for prompt in PROMPTS:
        _, prompt_ids, served = _chat(fp32_client, prompt)
        result = compare_greedy_resynced(
            served, lambda prefix, n: reference.greedy(prompt_ids + prefix, n)
        )
        assert result.ok, f"{prompt!r}: {result.problem.detail}"
        tokens, ties = tokens + len(served), ties + len(result.ties)
    print(f"\nfp32: {tokens} tokens over {len(PROMPTS)} prompts, {ties} partings at a near-tie")


QWEN2_PROMPTS = (
    "What is the capital of France? Answer in one sentence.",
    "List three prime numbers greater than 50.",
)


def test_qwen2_serves_and_every_greedy_token_equals_transformers_in_fp32(server_logs):
    """A second architecture (Qwen2: q/k/v biases, 14 query heads over 2 KV heads)
    serves with --lynx on this CPU, token for token as transformers in fp32."""
    from lynx_deploy.models import prepare
    from lynx_testing.prompts import chat_prompt
    from transformers import AutoTokenizer

    path = prepare("qwen2")
    server = SGLangServer(
        path, ["--lynx", "--dtype", "float32"], log_path=server_logs / "qwen2-server.log"
    ).start()
    try:
        reference = HFReference(path, dtype="float32")  # loads while the server starts
        tokenizer = AutoTokenizer.from_pretrained(path)
        server.wait_ready()
        for prompt in QWEN2_PROMPTS:
            ids = tokenizer.encode(chat_prompt(tokenizer, prompt), add_special_tokens=False)
            served = server.post_json(
                "/generate",
                {"input_ids": ids, "sampling_params": {"max_new_tokens": 24, "temperature": 0}},
            )["output_ids"]
            result = compare_greedy_resynced(
                served, lambda prefix, n: reference.greedy(ids + prefix, n)
            )
            assert result.ok, f"{prompt!r}: {result.problem.detail}"
            assert len(served) > 3
    finally:
        server.stop()
