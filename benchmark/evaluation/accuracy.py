"""Long-context task items on a served PD pair: generation, scoring, and item-for-item comparison of variants.

Every item is sent through the router as a greedy `/generate` with the top-2
log-probabilities of each output token, the same request in every variant,
so two variants' outputs can be compared token by token (`lynx_testing.judge`):
equal, equal after near ties of the reference (each tie's later tokens judged
against the reference continued from the candidate's prefix, where a server
that decodes as the reference is given), or a mismatch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict

from evaluation.plan import ItemSpec
from lynx_testing.judge import Answer, judge_pair, request_continuation
from lynx_deploy.processes import post_json
from lynx_testing.tasks import (
    TaskItem,
    multikey_item,
    needle_item,
    string_match_all,
    variable_tracking_item,
)

TOP_LOGPROBS = 2


def build_item(tokenizer, spec: ItemSpec) -> TaskItem:
    """The task item `spec` describes, in `tokenizer`'s tokens."""
    if spec.task == "multikey":
        return multikey_item(tokenizer, spec.tokens, spec.depth, spec.seed)
    if spec.task in ("needle", "passkey"):
        style = "magic-number" if spec.task == "needle" else "passkey"
        return needle_item(tokenizer, spec.tokens, spec.depth, spec.seed, style=style)
    if spec.task == "variable-tracking":
        return variable_tracking_item(tokenizer, spec.tokens, spec.seed)
    raise ValueError(f"unknown task {spec.task!r}")


def item_id(spec: ItemSpec) -> str:
    return f"{spec.task}-{spec.tokens}-d{spec.depth:g}-s{spec.seed}"


def request_body(item: TaskItem, spec: ItemSpec) -> dict:
    return {
        "text": item.prompt,
        "sampling_params": {"max_new_tokens": spec.max_new_tokens, "temperature": 0},
        "return_logprob": True,
        "top_logprobs_num": TOP_LOGPROBS,
    }


def run_item(url: str, item: TaskItem, spec: ItemSpec, encode: Callable[[str], list[int]] | None = None) -> dict:
    """Generate one item's answer through the router at `url` and score it; `encode` (the
    servers' tokenizer) gives the record its prompt's token ids, which a continuation needs."""
    answer = post_json(f"{url}/generate", request_body(item, spec), timeout=1200)
    meta = answer["meta_info"]
    top2 = [[(int(tok), float(lp)) for lp, tok, *_ in position[:2]] for position in meta["output_top_logprobs"]]
    lynx = meta.get("lynx") if isinstance(meta.get("lynx"), dict) else {}
    prompt_ids = encode(item.prompt) if encode is not None else None
    if prompt_ids is not None and len(prompt_ids) != meta["prompt_tokens"]:
        raise RuntimeError(f"{item_id(spec)}: {len(prompt_ids)} prompt tokens here, {meta['prompt_tokens']} served")
    return {
        "item": item_id(spec),
        "spec": asdict(spec),
        "prompt_tokens": meta["prompt_tokens"],
        "prompt_ids": prompt_ids,
        "answers": list(item.answers),
        "text": answer["text"],
        "score": string_match_all(answer["text"], item.answers),
        "output_ids": [int(t) for t in answer["output_ids"]],
        "top2": top2,
        "lynx": {k: lynx[k] for k in ("speculative_tokens", "accepted_tokens", "rollbacks") if k in lynx},
    }


def run_items(url: str, items: Sequence[tuple[ItemSpec, TaskItem]], step: Callable[[], None],
              encode: Callable[[str], list[int]] | None = None) -> list[dict]:  # fmt: skip
    out = []
    for spec, item in items:
        out.append(run_item(url, item, spec, encode))
        step()
    return out


def compare(reference: Sequence[dict], candidate: Sequence[dict], reference_url: Callable[[], str] | None = None) -> list[dict]:
    """Per item both variants ran: the candidate's tokens judged against the reference's.

    With `reference_url` (a server that decodes greedily as the reference, asked only after a
    near tie) the tokens after each tie are judged against the reference continued from the
    candidate's prefix; without it (a lossy variant against bf16, where only the first parting
    means something) they are counted as ``unchecked``. ``verdict``: ``equal``, ``near_tie``
    (equal but for near ties) or ``mismatch``; ``position`` and ``gap``: the first parting's.
    """
    by_id = {r["item"]: r for r in reference}
    out = []
    for index, cand in enumerate(candidate):
        ref = by_id.get(cand["item"])
        if ref is None:
            continue
        prompt = tuple(ref.get("prompt_ids") or ())
        continuation = None
        if reference_url is not None and prompt:
            params = request_body_params(ref)

            def continuation(ids, n, params=params, prompt=prompt):
                return request_continuation(post_json, reference_url(), params, len(prompt))(ids, n)

        tally = judge_pair(Answer(prompt, tuple(cand["output_ids"])),
                           Answer(prompt, tuple(ref["output_ids"]), tuple(_top2(ref["top2"]))), continuation, index)  # fmt: skip
        first = tally.partings[0] if tally.partings else None
        verdict = "mismatch" if tally.wrong else "near_tie" if tally.equal_after_ties else "equal"
        out.append({
            "item": cand["item"],
            "verdict": verdict,
            "position": first.position if first else None,
            "gap": first.gap if first else None,
            "detail": next((p.detail for p in tally.partings if p.kind == "mismatch"), ""),
            "partings": [p.__dict__ for p in tally.partings],
            "tokens_unchecked": tally.unchecked,
            "reference_continuations": tally.continuations,
            "scores": (ref["score"], cand["score"]),
        })  # fmt: skip
    return out


def request_body_params(record: dict) -> dict:
    """The sampling parameters an item's record was generated with."""
    return {"max_new_tokens": record["spec"]["max_new_tokens"], "temperature": 0}


def _top2(positions) -> list:
    return [(tuple(p[0]), tuple(p[1])) for p in positions]


def summarize(results: Sequence[dict]) -> dict:
    """Mean score per task and overall, item count, and speculation totals."""
    tasks: dict[str, list[float]] = {}
    for r in results:
        tasks.setdefault(f"{r['spec']['task']}@{r['spec']['tokens']}", []).append(r["score"])
    spec = sum(r["lynx"].get("speculative_tokens", 0) for r in results)
    accepted = sum(r["lynx"].get("accepted_tokens", 0) for r in results)
    return {
        "items": len(results),
        "mean_score": sum(r["score"] for r in results) / len(results) if results else None,
        "by_task": {k: {"items": len(v), "mean_score": sum(v) / len(v)} for k, v in tasks.items()},
        "speculative_tokens": spec,
        "accepted_tokens": accepted,
        "acceptance": accepted / spec if spec else None,
        "rollbacks": sum(r["lynx"].get("rollbacks", 0) for r in results),
    }
