"""The requests of the PD tests' suites (`pd_scenarios` sends each deployment its suites)."""

from __future__ import annotations

from lynx_testing.prompts import chat_prompt, long_question
from request_types import request_types

PROMPT_TOKENS = (512, 1024, 2048)
MAX_TOKENS = 32
DISTRIBUTION_SEEDS = range(1000, 1096)  # one short sampled request per seed
# Essay excerpts of the "pages" suite: with SmolLM2's chat template, prompts of 365 and 468
# tokens (neither a multiple of 16, so of no page size used here nor of the 64-token key
# group), sharing their first 341 tokens: the second reuses 336 of them (21 pages of 16) or
# 320 (5 pages of 64) from the decode radix cache, and its transfer starts there.
SHARED_PREFIX_EXCERPTS = (317, 420)
PAGES_MAX_TOKENS = 16
BRIEF_TOKENS = (250, 400)  # the "brief" suite: prompts of a few hundred tokens, few new tokens
BRIEF_MAX_TOKENS = 12


def suites(tokenizer) -> dict[str, list[dict]]:
    """Request bodies per suite."""

    def body(content, **params):
        sampling = {"max_new_tokens": MAX_TOKENS, "temperature": 0, **params}
        return {"text": chat_prompt(tokenizer, content), "sampling_params": sampling}

    long = [long_question(tokenizer, n, index=i) for i, n in enumerate(PROMPT_TOKENS)]
    short = "What is the capital of France? Answer in one word."
    return {
        "greedy": [body(q) for q in long],
        "short": [body(long[0])],
        "stops": [
            body(long[1], max_new_tokens=5),
            body(long[1], stop=["essay"]),
            body(long[0], stop_token_ids=[260]),
            body(short),
        ],
        "sampling": [body(q, temperature=0.8, sampling_seed=7 + i) for i, q in enumerate(long[:2])],
        "concurrent": [body(q) for q in (long[2], long[0], short, long[1])],
        "openai": [{"messages": [{"role": "user", "content": short}]}],
        "radix": [body(long[1])],
        "pages": [body(long_question(tokenizer, n), max_new_tokens=PAGES_MAX_TOKENS) for n in SHARED_PREFIX_EXCERPTS],
        "brief": [
            body(long_question(tokenizer, n, index=i), max_new_tokens=BRIEF_MAX_TOKENS) for i, n in enumerate(BRIEF_TOKENS)
        ],
        "distribution": [
            body("Tell me a very short story.", temperature=1.0, max_new_tokens=4, sampling_seed=seed)
            for seed in DISTRIBUTION_SEEDS
        ],
        "types": [{"name": t.name, "how": t.how, "body": t.body} for t in request_types(tokenizer)],
        "faults": fault_bodies(tokenizer),
        "mixed": mixed_load(tokenizer, MIXED_REQUESTS),
    }


MIXED_REQUESTS = 24  # the default tier's mixed load with client aborts (`test_pd_failures`)


def fault_bodies(tokenizer) -> list[dict]:
    """The fault tests' requests (`test_pd_failures`): a 2k-token prompt (its KV outlasts the
    no-progress timeout on their link), the same prompt extended, and a 1k-token one."""
    long = request_body(tokenizer, 2048)
    return [long, {**long, "text": long["text"] + " Answer in one short sentence."}, request_body(tokenizer, 1024, index=5)]


def request_body(tokenizer, tokens: int, index: int = 0, max_new_tokens: int = 8) -> dict:
    """A greedy `/generate` body: a chat-templated essay excerpt of about `tokens` tokens and a question."""
    text = chat_prompt(tokenizer, long_question(tokenizer, tokens, index=index))
    return {"text": text, "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0}}


def mixed_load(tokenizer, count: int, lengths=(64, 256, 512, 768)) -> list[dict]:
    """`count` requests of mixed lengths and types: greedy, seeded sampling, stop strings."""
    bodies = []
    for index in range(count):
        body = request_body(tokenizer, lengths[index % len(lengths)], index=index, max_new_tokens=12)
        kind = index % 3
        if kind == 1:
            body["sampling_params"].update(temperature=0.8, sampling_seed=index)
        elif kind == 2:
            body["sampling_params"]["stop"] = [".", "\n"]
        bodies.append(body)
    return bodies
