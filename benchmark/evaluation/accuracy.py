"""Long-context task items on a served PD pair: generation, scoring, and item-for-item comparison of variants.

Every item is sent through the router as a greedy `/generate` with the top-2
log-probabilities of each output token, the same request in every variant,
so two variants' outputs can be compared by `lynx_testing.exactness`: equal,
parted at a near-tie of the reference, or a mismatch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict

from evaluation.plan import ItemSpec
from lynx_testing.exactness import compare_greedy
from lynx_testing.launch import post_json
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


def run_item(url: str, item: TaskItem, spec: ItemSpec) -> dict:
    """Generate one item's answer through the router at `url` and score it."""
    answer = post_json(f"{url}/generate", request_body(item, spec), timeout=1200)
    meta = answer["meta_info"]
    top2 = [[(int(tok), float(lp)) for lp, tok, *_ in position[:2]] for position in meta["output_top_logprobs"]]
    lynx = meta.get("lynx") if isinstance(meta.get("lynx"), dict) else {}
    return {
        "item": item_id(spec),
        "spec": asdict(spec),
        "prompt_tokens": meta["prompt_tokens"],
        "answers": list(item.answers),
        "text": answer["text"],
        "score": string_match_all(answer["text"], item.answers),
        "output_ids": [int(t) for t in answer["output_ids"]],
        "top2": top2,
        "lynx": {k: lynx[k] for k in ("speculative_tokens", "accepted_tokens", "rollbacks") if k in lynx},
    }


def run_items(url: str, items: Sequence[tuple[ItemSpec, TaskItem]], step: Callable[[], None]) -> list[dict]:
    out = []
    for spec, item in items:
        out.append(run_item(url, item, spec))
        step()
    return out


def compare(reference: Sequence[dict], candidate: Sequence[dict]) -> list[dict]:
    """Per item both variants ran: the exactness verdict of the candidate's tokens against the reference's."""
    by_id = {r["item"]: r for r in reference}
    out = []
    for cand in candidate:
        ref = by_id.get(cand["item"])
        if ref is None:
            continue
        verdict = compare_greedy(ref["output_ids"], cand["output_ids"], [tuple(p) for p in ref["top2"]])
        out.append({
            "item": cand["item"],
            "verdict": verdict.verdict,
            "position": verdict.position,
            "gap": verdict.gap,
            "detail": verdict.detail,
            "scores": (ref["score"], cand["score"]),
        })  # fmt: skip
    return out


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
