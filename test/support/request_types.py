"""One request per kind SGLang serves, for the PD tests of every mode (`test_pd_request_types`).

Each entry names a request type and the native `/generate` body that
exercises it; `how` says how it is sent: through the router (``router``), as
an OpenAI chat completion straight to both servers with bootstrap room
`CHAT_ROOM` (``chat``: each sample of an ``n > 1`` request draws with a seed
derived from its room, so a fixed room makes two deployments' samples
comparable), or straight to both servers with list bootstrap fields
(``direct``: SGLang's router refuses batched bodies, and `smg` 1.13 drops
`logit_bias` from a `/generate` body, so a logit bias sent through it would
reach neither server; ``logit-bias-via-router`` sends it through the router
anyway, to check that it still does). Every prompt but the
second of ``batch-list`` is long enough that its residual lands while it
drafts on its anchor.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from lynx_testing.prompts import chat_prompt, essay_excerpt, long_question

PROMPT_TOKENS = 512
MAX_TOKENS = 24
TOP_LOGPROBS = 20  # as many as the references report, so a logprob request is the same request in both modes
CHAT_ROOM = 0x5EED_0C4A7  # the bootstrap room of every ``chat`` request
LOGIT_BIAS = {"30": -100.0, "260": 4.0}  # "." never, " the" more often: the greedy answer changes
PERSON_SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer"}},
    "required": ["name", "age"],
}


NAMES = (
    "greedy", "logprobs", "token-ids-logprobs", "sampled-seed-logprobs", "frequency-presence-penalty",
    "repetition-penalty", "logit-bias", "logit-bias-via-router", "min-new-tokens", "stop-string", "stop-regex",
    "json-schema", "regex", "ebnf", "n-2", "prompt-logprobs-no-output", "batch-list", "select-batch", "chat-n-2",
    "prompt-logprobs-from-start", "same-prompt-batch",
)  # fmt: skip


@dataclass(frozen=True)
class RequestType:
    name: str
    body: dict
    how: str = "router"
    notes: tuple[str, ...] = field(default_factory=tuple)


def request_types(tokenizer) -> list[RequestType]:
    long = chat_prompt(tokenizer, long_question(tokenizer, PROMPT_TOKENS, index=11))
    person = chat_prompt(
        tokenizer,
        long_question(tokenizer, PROMPT_TOKENS, index=12)
        + " Then describe a person from the essay as JSON with a name and an age.",
    )

    fresh = chat_prompt(tokenizer, long_question(tokenizer, PROMPT_TOKENS, index=13))
    # Wants a one-word answer (which min_new_tokens then holds off), after an essay long enough to draft on.
    say_yes = chat_prompt(tokenizer, essay_excerpt(tokenizer, PROMPT_TOKENS, index=14) + "\n\nSay yes.")

    def body(text=long, **params):
        return {"text": text, "sampling_params": {"max_new_tokens": MAX_TOKENS, "temperature": 0, **params}}

    logprobs = {"return_logprob": True, "top_logprobs_num": TOP_LOGPROBS}
    types = [
        RequestType("greedy", body()),
        RequestType("logprobs", {**body(), **logprobs}),
        RequestType("token-ids-logprobs", {**body(), "return_logprob": True, "token_ids_logprob": [11, 30, 198]}),
        RequestType("sampled-seed-logprobs", {**body(temperature=0.8, top_p=0.95, sampling_seed=21), **logprobs}),
        RequestType("frequency-presence-penalty", body(frequency_penalty=0.8, presence_penalty=0.6)),
        RequestType("repetition-penalty", body(repetition_penalty=1.3)),
        RequestType("logit-bias", body(logit_bias=LOGIT_BIAS), how="direct"),
        RequestType("logit-bias-via-router", body(logit_bias=LOGIT_BIAS)),
        RequestType("min-new-tokens", body(say_yes, min_new_tokens=12)),
        RequestType("stop-string", body(stop=[" the ", "."])),
        RequestType("stop-regex", body(stop_regex=r"\bis\b")),
        RequestType("json-schema", body(person, json_schema=_json(PERSON_SCHEMA), max_new_tokens=32)),
        RequestType("regex", body(regex=r"(Yes|No), because [a-z ]{5,40}\.")),
        RequestType("ebnf", body(ebnf='root ::= "The essay " ("argues" | "says" | "shows") " that " [a-z ]+ "."')),
        RequestType("n-2", body(n=2)),
        RequestType("prompt-logprobs-no-output", {
            "text": long, "sampling_params": {"max_new_tokens": 0, "temperature": 0},
            "return_logprob": True, "logprob_start_len": 400}),  # fmt: skip
        RequestType("batch-list", {
            "text": [long, chat_prompt(tokenizer, "Name three colors.")],
            "sampling_params": {"max_new_tokens": MAX_TOKENS, "temperature": 0}}, how="direct"),  # fmt: skip
        RequestType("select-batch", {
            "text": [long + " The essay is about", long + " The essay is about money"],
            "sampling_params": {"max_new_tokens": 0, "temperature": 0},
            "return_logprob": True, "return_text_in_logprobs": True, "logprob_start_len": 500}, how="direct"),  # fmt: skip
        # Token ids, top logprobs and meta_info (Lynx's metrics) per choice, to judge each sample.
        RequestType("chat-n-2", {
            "messages": [{"role": "user", "content": essay_excerpt(tokenizer, PROMPT_TOKENS, index=15)
                          + "\n\nName a fruit."}], "n": 2,
            "temperature": 1.0, "max_tokens": 8, "seed": 3, "logprobs": True, "top_logprobs": TOP_LOGPROBS,
            "return_token_ids": True, "return_meta_info": True}, how="chat"),  # fmt: skip
        # The prompt of the first types again, with prompt logprobs from its first token: the prefill's
        # radix cache holds it, but the match stops at token 0 and the whole prompt is computed anew.
        RequestType("prompt-logprobs-from-start",
                    {**body(), "return_logprob": True, "logprob_start_len": 0}),  # fmt: skip
        # A new prompt twice in one batch: the prefill computes both; the second's tokens are cached
        # by the first when it is inserted.
        RequestType("same-prompt-batch", {**body(), "text": [fresh, fresh]}, how="direct"),
    ]
    assert tuple(t.name for t in types) == NAMES
    return types


def _json(value) -> str:
    import json

    return json.dumps(value)
