"""Every request type SGLang serves, through a real prefill/decode pair: `lynx` mode equals `int8` mode.

The requests (`request_types`) are sent to the shared `int8` and `lynx`
deployments (`pd_scenarios`; `lynx` on a slow emulated link, so its residual
lands while it drafts on the anchor, four requests at a time). For each type
the `lynx` answer must equal the `int8` one token for token, with the near-tie
rule of `lynx_testing.exactness`, its logprobs within `LOGPROB_TOLERANCE` and
its finish reason and text equal where the tokens are. The extended tier also serves every type in `bf16` and
`int4` mode.
"""

from __future__ import annotations

import json
import re

import pytest
from lynx_testing.exactness import compare_greedy, compare_sampled
from pd_scenarios import top2, top_logprobs
from request_types import NAMES, PERSON_SCHEMA

pytestmark = pytest.mark.server

LOGPROB_TOLERANCE = 0.05
SAMPLED = {"sampled-seed-logprobs"}
NO_OUTPUT = {"prompt-logprobs-no-output", "select-batch"}
CHAT = {"chat-n-2"}


def _names(bodies) -> list[str]:
    return [t["name"] for t in bodies["types"]]


@pytest.fixture(scope="module")
def answers(pd_runs, pd_bodies):
    """name -> (lynx answer, int8 answer); answers of list requests are lists."""
    lynx, int8 = pd_runs["lynx"].outputs["types"], pd_runs["int8"].outputs["types"]
    return {name: (a, b) for name, a, b in zip(_names(pd_bodies), lynx, int8, strict=True)}


def _as_list(answer) -> list:
    assert not isinstance(answer, str), answer
    return answer if isinstance(answer, list) else [answer]


@pytest.fixture(scope="module")
def vocab(model_path) -> int:
    return json.loads((model_path / "config.json").read_text())["vocab_size"]


def _compare(name: str, lynx: dict, ref: dict, seed: int | None, vocab: int) -> str:
    """Assert `lynx` equals the reference `ref` (near-tie rule, logprobs); the verdict."""
    if seed is None:
        result = compare_greedy(ref["output_ids"], lynx["output_ids"], top2(ref))
    else:
        result = compare_sampled(ref["output_ids"], lynx["output_ids"], top_logprobs(ref), seed, vocab)
    assert result.ok, f"{name}: {result.detail}"
    same = len(lynx["output_ids"]) if result.verdict == "equal" else result.position
    if result.verdict == "equal":
        assert lynx["text"] == ref["text"], name
        assert lynx["meta_info"]["finish_reason"] == ref["meta_info"]["finish_reason"], name
    mine = lynx["meta_info"].get("output_token_logprobs")
    if mine:
        theirs = ref["meta_info"]["output_token_logprobs"]
        for pos, (a, b) in enumerate(zip(mine[:same], theirs[:same])):
            assert a[1] == b[1] and abs(a[0] - b[0]) < LOGPROB_TOLERANCE, f"{name} position {pos}: {a} vs {b}"
        if "output_top_logprobs" in lynx["meta_info"] and lynx["meta_info"]["output_top_logprobs"]:
            for pos, (a, b) in enumerate(zip(lynx["meta_info"]["output_top_logprobs"][:same],
                                             ref["meta_info"]["output_top_logprobs"][:same])):  # fmt: skip
                best = dict((t, lp) for lp, t, *_ in b)
                for lp, token, *_ in a[:5]:
                    if token in best:
                        assert abs(lp - best[token]) < LOGPROB_TOLERANCE, f"{name} top logprobs at {pos}"
    ids = lynx["meta_info"].get("output_token_ids_logprobs")
    if ids:
        for pos, (a, b) in enumerate(zip(ids[:same], ref["meta_info"]["output_token_ids_logprobs"][:same])):
            if not a or not b:  # the first token's: the prefill does not compute them
                assert not a and not b, f"{name} token-id logprobs at {pos}: {a} vs {b}"
                continue
            for (lp_a, t_a, *_), (lp_b, t_b, *_) in zip(a, b, strict=True):
                assert t_a == t_b and abs(lp_a - lp_b) < LOGPROB_TOLERANCE, f"{name} token-id logprobs at {pos}"
    return result.verdict


@pytest.mark.parametrize("name", NAMES)
def test_lynx_mode_serves_the_request_type_exactly_like_int8_mode(answers, pd_bodies, vocab, name):
    lynx, ref = answers[name]
    body = next(t["body"] for t in pd_bodies["types"] if t["name"] == name)
    if name in CHAT:
        choices = [c["message"]["content"] for c in lynx["choices"]]
        assert len(choices) == body["n"] and all(choices), lynx
        assert len(set(choices)) > 1, "the samples of one request differ"
        return
    mine, theirs = _as_list(lynx), _as_list(ref)
    assert len(mine) == len(theirs) == (2 if name in ("n-2", "batch-list", "select-batch", "same-prompt-batch") else 1)
    if name in NO_OUTPUT:
        for a, b in zip(mine, theirs, strict=True):
            assert a["output_ids"] == [] and a["meta_info"]["finish_reason"]["type"] == "length"
            assert a["meta_info"]["output_token_logprobs"][0][1] == b["meta_info"]["output_token_logprobs"][0][1]
        return
    seed = body["sampling_params"].get("sampling_seed") if name in SAMPLED else None
    verdicts = [_compare(name, a, b, seed, vocab) for a, b in zip(mine, theirs, strict=True)]
    print(f"\n{name}: {verdicts}, lynx {[a['meta_info'].get('lynx') for a in mine]}")
    _check_type_specifics(name, body, mine)


def _check_type_specifics(name: str, body: dict, answers: list[dict]) -> None:
    text = answers[0]["text"]
    if name == "min-new-tokens":
        assert answers[0]["meta_info"]["completion_tokens"] >= body["sampling_params"]["min_new_tokens"]
    elif name == "json-schema":
        value = json.loads(text)
        assert set(value) == set(PERSON_SCHEMA["properties"]) and isinstance(value["age"], int)
    elif name == "regex":
        assert re.fullmatch(body["sampling_params"]["regex"], text), text
    elif name == "ebnf":
        assert text.startswith("The essay "), text
    elif name == "stop-string":
        assert answers[0]["meta_info"]["finish_reason"]["type"] == "stop"
    elif name == "n-2":
        assert answers[0]["output_ids"] == answers[1]["output_ids"], "greedy samples agree"


def test_request_types_really_speculate_on_their_anchors(answers):
    """Most types drafted on the anchor (whether a given request does depends on when its residual
    lands). How many requests each verify pass took is printed, not asserted: with residual
    deadlines (the default priority) each residual goes one draft window after its anchor instead
    of behind every newer anchor, so these requests' residuals land one at a time and each verify
    runs alone; `speculate/test_controller.py` checks a verify pass over several requests."""
    metrics = {}
    for name, (lynx, _) in answers.items():
        if name in CHAT | NO_OUTPUT:
            continue
        metrics[name] = [a["meta_info"]["lynx"] for a in _as_list(lynx)]
    drafted = [name for name, ms in metrics.items() if any(m["speculative_tokens"] > 0 for m in ms)]
    assert len(drafted) >= len(metrics) * 2 // 3, f"only {drafted} drafted"
    print(f"\ndrafted on the anchor: {len(drafted)} of {len(metrics)} types: {drafted}")
    print(f"largest verify batch: {max(m['verify_batch'] for ms in metrics.values() for m in ms)}")


@pytest.mark.extended
@pytest.mark.parametrize("mode", ["bf16-types", "int4-types"])
def test_every_mode_serves_every_request_type(pd_runs, pd_bodies, mode):
    for name, answer in zip(_names(pd_bodies), pd_runs[mode].outputs["types"], strict=True):
        assert not isinstance(answer, str), f"{mode} {name}: {answer}"
        if name in CHAT:
            assert len(answer["choices"]) == 2
        else:
            for one in _as_list(answer):
                assert name in NO_OUTPUT or one["output_ids"], f"{mode} {name}"
