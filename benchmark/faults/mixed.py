"""Requests of SGLang's other kinds beside a soak round's load, each judged against `int8` decoding of it.

bench_serving sends plain greedy completions. Beside each soak round's load,
`send` posts through the router one request of each kind in `KINDS` (a prompt
of random token ids with a kind's sampling parameters: penalties, a logit
bias, a minimum length, stop strings, a stop regex, a JSON schema, a regex;
top-2 logprobs per token), two at a time, and then the same request to the
reference server. A logit bias goes to the servers directly (`DIRECT`): SGLang's
router `smg` 1.13 drops `logit_bias` from a `/generate` body. `judge` judges each answer against the reference's: the
near-tie rule, then the rest against the reference continued from the
answer's own prefix with the request's parameters
(`lynx_testing.judge.request_continuation`; where a parameter depends on the
whole output, a penalty or a grammar, the tokens after a near tie are counted
unchecked, as in the request-type tests).
"""

from __future__ import annotations

import json
import random
import urllib.error
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from lynx_testing.judge import Tally, answer_of, judge_pair, request_continuation

PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer"}},
          "required": ["name", "age"]}  # fmt: skip
KINDS: dict[str, dict] = {
    "greedy": {},
    "frequency-presence-penalty": {"frequency_penalty": 0.8, "presence_penalty": 0.6},
    "repetition-penalty": {"repetition_penalty": 1.3},
    "logit-bias": {"logit_bias": {"30": -100.0, "260": 4.0}},
    "min-new-tokens": {"min_new_tokens": 12},
    "stop-string": {"stop": [" the ", "."]},
    "stop-regex": {"stop_regex": r"\bis\b"},
    "json-schema": {"json_schema": json.dumps(PERSON)},
    "regex": {"regex": r"(Yes|No), because [a-z ]{5,40}\."},
}

DIRECT = ("logit-bias",)  # kinds sent straight to the pair, bypassing the router

Post = Callable[..., dict]


def bodies(seed: int, vocab: int, input_tokens: int, output_tokens: int) -> list[tuple[str, dict]]:
    """One `/generate` body per kind: a new prompt of random token ids each (seeded), greedy."""
    rng = random.Random(seed)
    out = []
    for kind, params in KINDS.items():
        ids = [rng.randrange(100, vocab - 200) for _ in range(input_tokens)]
        out.append((kind, {"input_ids": ids, "return_logprob": True, "top_logprobs_num": 2,
                           "sampling_params": {"max_new_tokens": output_tokens, "temperature": 0, **params}}))  # fmt: skip
    return out


def send(post: Post, direct: Callable[[dict], dict | str], url: str, reference_url: str,
         items: list[tuple[str, dict]], timeout: float) -> list[dict]:  # fmt: skip
    """Each request through `url` (two at a time; a `DIRECT` kind by ``direct(body)``, which answers
    the decode server's reply or an error text), then to the reference: per kind its answer or error."""

    def one(item: tuple[str, dict]) -> dict:
        kind, body = item
        try:
            answer = direct(body) if kind in DIRECT else post(f"{url}/generate", body, timeout)
        except urllib.error.HTTPError as exc:
            answer = f"HTTP {exc.code}: {exc.read().decode(errors='replace')}"
        except OSError as exc:
            answer = f"{type(exc).__name__}: {exc}"
        if not isinstance(answer, dict):
            return {"kind": kind, "body": body, "error": str(answer)[:240]}
        return {"kind": kind, "body": body, "answer": answer, "reference": post(f"{reference_url}/generate", body, timeout)}

    with ThreadPoolExecutor(2) as pool:
        return list(pool.map(one, items))


def judge(results: list[dict], post: Post, reference_url: str) -> dict:
    """The kinds' counts: answered (drafted), failed with reasons, and every answer's tokens judged."""
    tally, reasons, drafted = Tally(), [], 0
    for index, result in enumerate(results):
        answer = result.get("answer")
        finish = ((answer or {}).get("meta_info") or {}).get("finish_reason") or {}
        if answer is None or finish.get("type") not in ("length", "stop"):
            reasons.append(f"{result['kind']}: {result.get('error') or finish.get('message') or finish}")
            continue
        drafted += (answer["meta_info"].get("lynx") or {}).get("speculative_tokens", 0) > 0
        prompt, params = result["body"]["input_ids"], result["body"]["sampling_params"]
        continuation = request_continuation(post, reference_url, params, len(prompt))
        tally.add(judge_pair(answer_of(prompt, answer), answer_of(prompt, result["reference"]), continuation, index))
    return {
        "kinds": [r["kind"] for r in results],
        "requests": len(results),
        "answered": len(results) - len(reasons),
        "drafted": drafted,
        "failed": len(reasons),
        "reasons": reasons,
        "wrong": tally.wrong + tally.unmatched,
        "tokens_judged": tally.tokens,
        "tokens_unchecked": tally.unchecked,
        "near_ties": sum(p.kind == "near_tie" for p in tally.partings),
        "partings": [p.__dict__ for p in tally.partings],
    }


def passed(verdict: dict, sent: int) -> bool:
    """Every one of the `sent` requests answered and none wrong (no fault touches them)."""
    return verdict["requests"] == verdict["answered"] == sent and verdict["wrong"] == 0
