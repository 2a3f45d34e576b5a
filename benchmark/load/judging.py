"""Every `lynx` and `auto` answer of a run judged against `int8`'s answer to the same prompt, token by token."""

from __future__ import annotations

from lynx_testing.judge import Answer, Tally, judge_pair, server_continuation, top_two
from lynx_deploy.processes import post_json

from load.plan import JUDGED_MODES, REFERENCE_MODE, base_mode


def answers(records: list[dict], encode) -> list[tuple[tuple, Answer]]:
    """The successful records as judge answers, each keyed by its request (prompt and asked length:
    a trace repeats prompts with other lengths); a text prompt is tokenized as the server did (`encode`)."""
    out = []
    for r in records:
        if not r.get("success") or r.get("output_ids") is None:
            continue
        prompt = tuple(r["prompt_ids"] if r.get("prompt_ids") is not None else encode(r["prompt_text"]))
        answer = Answer(prompt, tuple(r["output_ids"]), tuple(top_two(r.get("top2") or [])))
        out.append(((prompt, r.get("output_len")), answer))
    return out


def judge_points(rows: list[dict], reference_url: str, tokenizer=None) -> dict:
    """Per judged row (key -> counts), and the totals; ``reference_url`` answers the continuations."""
    if tokenizer is None:
        encode = _server_tokenizer()
    else:
        encode = tokenizer.encode
    continue_reference = server_continuation(post_json, reference_url)
    by_key = {row["key"]: row for row in rows}
    per_point, total = {}, Tally()
    for row in rows:
        if base_mode(row["mode"]) not in JUDGED_MODES:
            continue
        ref_key = row["key"].rsplit("/", 1)[0] + "/" + REFERENCE_MODE
        if ref_key not in by_key:
            per_point[row["key"]] = {"skipped": f"no {REFERENCE_MODE} run at this point"}
            continue
        candidates = [answer for _, answer in answers(row["records"], encode)]
        tally = judge_requests(answers(row["records"], encode), dict(answers(by_key[ref_key]["records"], encode)),
                               continue_reference)  # fmt: skip
        tally.failed = sum(1 for r in row["records"] if not r.get("success"))
        per_point[row["key"]] = tally.as_dict()
        per_point[row["key"]]["partings"] = [
            second_opinion(p, candidates[p["request"]], continue_reference) for p in per_point[row["key"]]["partings"]
        ]
        total.add(tally)
    summary = total.as_dict()
    summary["partings"] = [dict(p, point=key) for key, point in per_point.items() for p in point.get("partings", [])]
    return {"points": per_point, "total": summary}


def judge_requests(candidates: list[tuple[tuple, Answer]], references: dict[tuple, Answer], continue_reference) -> Tally:
    """Each candidate against the reference's answer to the same request; one without counts as such."""
    tally = Tally()
    for index, (key, candidate) in enumerate(candidates):
        reference = references.get(key)
        if reference is None:
            tally.answers += 1
            tally.unmatched += 1
            continue
        tally.add(judge_pair(candidate, reference, continue_reference, index))
    return tally


def second_opinion(parting: dict, candidate: Answer, continue_reference) -> dict:
    """A wrong parting, with what a fresh int8 decoder (the reference server, one request alone)
    picks at that position after the same tokens: it stays counted wrong, but whether int8 decoding
    itself picks the candidate's token there says whether the parting is Lynx's or the arithmetic's."""
    if parting["kind"] != "mismatch":
        return parting
    position = parting["position"]
    tokens, top2 = continue_reference([*candidate.prompt_ids, *candidate.output_ids[:position]], 1)
    (first, first_lp), (second, second_lp) = top2[0]
    mine = candidate.output_ids[position] if position < len(candidate.output_ids) else None
    return parting | {"fresh_int8": {"token": first, "second": second, "gap": first_lp - second_lp,
                                     "picks_candidates_token": first == mine}}  # fmt: skip


def _server_tokenizer():
    from transformers import AutoTokenizer

    from lynx_deploy.models import prepare_smollm2

    tokenizer = AutoTokenizer.from_pretrained(str(prepare_smollm2()))
    return tokenizer.encode
