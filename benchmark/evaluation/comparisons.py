"""Which variants' items are judged against which, and the servers that continue a reference.

`int8` -> `lynx` and `bf16` -> `stock` must be exact: every token of the
candidate equals the reference's, or parts at a near tie after which the rest
equals the reference continued from the candidate's prefix, on one server
that decodes as the reference (`Continuations`). The lossy variants against
bf16 keep their first parting (how early a lossy cache changes the answer).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from evaluation import accuracy
from evaluation.plan import ModelPlan
from lynx_deploy.server import SGLangServer, ServerSlot


COMPARISONS = (
    ("int8", "lynx"), ("bf16", "stock"), ("bf16", "int8"), ("bf16", "int4"), ("bf16", "lynx-2+6"),
)  # fmt: skip
# The comparisons that must be exact (Lynx verifies against int8; SGLang's stock backend moves bf16
# KV), and the `--lynx` arguments of one server that decodes as their reference: it continues the
# reference after a near tie. The others set a lossy variant against bf16: only their first parting counts.
EXACT_REFERENCES = {"int8": ("--lynx-mode", "int8", "--lynx-loopback"), "bf16": ()}
EXACT = {("int8", "lynx"), ("bf16", "stock")}


class Continuations(ServerSlot):
    """Single servers of `plan.model` continuing a reference's answers, one at a time, each started
    the first time a near tie needs it; all stopped on leaving the `with` block."""

    def __init__(self, plan: ModelPlan, model_path: Path, out_dir: Path, log) -> None:
        super().__init__()
        self._plan, self._model_path, self._out_dir, self._log = plan, model_path, out_dir, log

    def url(self, reference: str) -> Callable[[], str]:
        return lambda: self.serve(reference, lambda: self._server(reference))

    def _server(self, reference: str) -> SGLangServer:
        self._log(f"[{self._plan.model}] starting a {reference} continuation server")
        args = ["--lynx", *EXACT_REFERENCES[reference], *self._plan.server_args]
        log = self._out_dir / "logs" / f"{self._plan.model}-continuation-{reference}.log"
        return SGLangServer(self._model_path, args, max_total_tokens=self._plan.max_total_tokens, log_path=log)


def comparisons(variants: dict, reference_url: Callable[[str], Callable[[], str]] | None = None) -> list[dict]:
    """Each pair of `COMPARISONS` both of whose variants answered items: per item the judged verdict
    (`accuracy.compare`), counts, and the tokens after a near tie left unchecked (lossy pairs).
    `reference_url(reference)` gives the continuation server's URL getter of an exact pair's reference."""
    out = []
    for reference, candidate in COMPARISONS:
        ref, cand = variants.get(reference, {}).get("items"), variants.get(candidate, {}).get("items")
        if ref and cand:
            exact = (reference, candidate) in EXACT
            url = reference_url(reference) if exact and reference_url is not None else None
            verdicts = accuracy.compare(ref, cand, url)
            counts = {v: sum(1 for e in verdicts if e["verdict"] == v) for v in ("equal", "near_tie", "mismatch")}
            out.append({"reference": reference, "candidate": candidate, "exact": exact, "counts": counts,
                        "tokens_unchecked": sum(e["tokens_unchecked"] for e in verdicts), "items": verdicts})  # fmt: skip
    return out
