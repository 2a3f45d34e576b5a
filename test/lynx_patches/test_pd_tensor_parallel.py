"""Tensor parallelism inside a real prefill/decode pair: outputs equal tensor parallelism 1's.

Each shape runs a real pair behind SGLang's router (SmolLM2, fp32 compute
with a bf16 KV cache, `CPU_MODEL_ARGS`) and answers greedy requests, compared
token for token with a reference at TP 1 (one server at a time: the
reference's outputs are recorded and its server stopped before the pair
starts). SmolLM2's 3 KV heads do not divide by 2: at TP 2 SGLang pads them to
4, 2 per rank, so rank 1 holds head 2 and a zero head.

References: ``lynx`` and ``int8`` modes equal a single TP 1 server with
`--lynx-loopback --lynx-mode int8` (the int8 round trip of each prompt's KV,
in-process), ``int4`` mode its int4 twin, ``bf16`` mode a plain TP 1 server.
TP changes the order of the all-reduced sums, so where outputs part, the
parting token must be the reference's second choice within `NEAR_TIE_GAP`
(`lynx_testing.exactness`); the summary line counts such partings. Prefill
TP 2 -> decode TP 2 in ``bf16``, ``int8`` and ``int4`` equals a single TP 2
server of the same kind (same sums in the same order) token for token, with
no near tie allowed: the transfer must add nothing to the mode's own
rounding. Against TP 1, ``int4`` parts there legitimately: a last-bit
difference before its 4-bit rounding can move a KV value a whole step, and a
TP 2 ``int4`` loopback server parts from TP 1's at the same token as the
pair (SmolLM2, the 1,024-token prompt, output token 9: 24811 at -1.864 over
260 at -1.914 at TP 1; 260 at -1.876 over 24811 at -1.916 at TP 2).

The default tier runs one pair: prefill TP 1 -> decode TP 2 in ``lynx`` mode
on a slow link (heterogeneous; the two decode ranks draft on their anchors and
agree before each verify pass), on the shared PD suites' greedy prompts,
against the ``int8`` pair's answers (`pd_scenarios`), so it needs no reference
server of its own. The extended tier (`--extended`) adds prefill TP 2 ->
decode TP 2 in every mode (``lynx`` against TP 1, the others against TP 2
servers) and the other heterogeneous shapes against TP 1 (about 5 minutes for
the first pair with its reference). Other
default-tier representatives: a real TP 2 server (`test_shapes.py`), every TP
shape's head routing between the real sides (`pd/test_tensor_parallel.py`)
and the decode ranks' agreement over a real gloo group
(`speculate/test_agree.py`).
"""

from __future__ import annotations

import pytest
from lynx_deploy.deployment import PDDeployment
from lynx_deploy.processes import post_json
from lynx_deploy.server import CPU_MODEL_ARGS, SGLangServer
from pd_judging import ContinuationServers, annotate, assert_greedy_answers_equal, judge_answers
from pd_scenarios import SLOW_LINK
from pd_suites import request_body
from server_state import lynx_state, wait_lynx_state

pytestmark = pytest.mark.server

PROMPT_TOKENS = (512, 1024, 1536)
MAX_NEW_TOKENS = 24
REFERENCE_ARGS = {
    "lynx": ("--lynx-mode", "int8", "--lynx-loopback"),
    "int8": ("--lynx-mode", "int8", "--lynx-loopback"),
    "int4": ("--lynx-mode", "int4", "--lynx-loopback"),
    "bf16": (),
}
MODE_ARGS = {
    "lynx": ("--lynx-mode", "lynx", *SLOW_LINK),
    "int8": ("--lynx-mode", "int8"),
    "int4": ("--lynx-mode", "int4"),
    "bf16": ("--lynx-mode", "bf16"),
}


@pytest.fixture(scope="module")
def bodies(model_path) -> list[dict]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_path))
    return [request_body(tokenizer, n, index=i, max_new_tokens=MAX_NEW_TOKENS) for i, n in enumerate(PROMPT_TOKENS)]


class References:
    """Single-server outputs (with top-2 logprobs, annotated with their requests) per reference kind
    and TP size, each server started the first time it is needed; `continuation(mode)` continues
    TP 1's after a near tie."""

    def __init__(self, model_path, bodies, log_dir) -> None:
        self._args, self._outputs = (model_path, bodies, log_dir), {}
        self.continuations = ContinuationServers(model_path, log_dir)

    def __getitem__(self, mode: str) -> list[dict]:
        return self.at(mode, tp=1)

    def at(self, mode: str, tp: int) -> list[dict]:
        kind = (*REFERENCE_ARGS[mode], *(("--tp-size", str(tp)) if tp > 1 else ()))
        if kind not in self._outputs:
            from transformers import AutoTokenizer

            model_path, bodies, log_dir = self._args
            self.continuations.close()  # one server at a time
            args = ["--lynx", *kind, *CPU_MODEL_ARGS]
            name = "-".join(kind).replace("--", "") or "plain"
            with SGLangServer(model_path, args, log_path=log_dir / f"tp-reference-{name}.log") as server:
                extra = {"return_logprob": True, "top_logprobs_num": 2}
                self._outputs[kind] = [post_json(f"{server.url}/generate", {**b, **extra}) for b in bodies]
            encode = AutoTokenizer.from_pretrained(str(model_path)).encode
            for body, answer in zip(bodies, self._outputs[kind], strict=True):
                annotate(answer, body, encode)
        return self._outputs[kind]

    def continuation(self, mode: str):
        return lambda: self.continuations.url(REFERENCE_ARGS[mode])


@pytest.fixture(scope="module")
def references(model_path, bodies, server_logs):
    refs = References(model_path, bodies, server_logs)
    yield refs
    refs.continuations.close()


def run_pair(model_path, bodies, log_dir, secret_file, mode: str, prefill_tp: int, decode_tp: int) -> dict:
    """One pair's answers, its (prefill, decode) TP sizes, and the decode server's free KV slots
    before and after."""
    args = [*MODE_ARGS[mode], "--lynx-secret-file", str(secret_file)]
    with PDDeployment(
        model_path,
        args,
        extra_args=CPU_MODEL_ARGS,
        prefill_args=("--tp-size", str(prefill_tp)),
        decode_args=("--tp-size", str(decode_tp)),
        max_total_tokens=8192,
        log_dir=log_dir / f"tp-{mode}-{prefill_tp}-{decode_tp}",
    ) as pd:
        info = pd.decode.get_json("/server_info")
        free_before = _free_slots(pd.decode)
        answers = [post_json(f"{pd.url}/generate", body) for body in bodies]
        # the last request's slots go back just after its answer
        wait_lynx_state(pd.decode, lambda s: s["kv_free_slots"] == free_before, 30)
        tp = (pd.prefill.get_json("/server_info")["tp_size"], info["tp_size"])
        return {"answers": answers, "tp": tp, "free": (free_before, _free_slots(pd.decode))}


def _free_slots(server: SGLangServer) -> int:
    return lynx_state(server)["kv_free_slots"]


@pytest.fixture(scope="module")
def secret_file(server_logs):
    import secrets

    path = server_logs / "tp-secret"
    path.write_text(secrets.token_hex(32))
    return path


def test_lynx_mode_prefill_tp1_to_decode_tp2_equals_the_int8_pair(model_path, pd_bodies, pd_runs, server_logs, secret_file):
    """The default tier's pair: a prefill rank encodes each decode rank's heads apart, both decode
    ranks draft on their anchors and verify together, every KV slot comes back, and the answers
    equal the TP 1 ``int8`` pair's (the near-tie rule: TP reorders the all-reduced sums)."""
    reference = pd_runs["int8"].outputs["greedy"]
    run = run_pair(model_path, pd_bodies["greedy"], server_logs, secret_file, "lynx", 1, 2)
    assert run["tp"] == (1, 2) and run["free"][1] == run["free"][0]
    assert_greedy_answers_equal(reference, run["answers"], "lynx tp1->tp2", pd_runs.continuation("int8"))
    metrics = [a["meta_info"]["lynx"] for a in run["answers"]]
    assert sum(m["speculative_tokens"] for m in metrics) > 0, metrics


@pytest.fixture(scope="module")
def lynx_tp2(model_path, bodies, server_logs, secret_file, references) -> dict:
    references["lynx"]  # the TP 1 reference runs (and stops) first: one deployment at a time
    return run_pair(model_path, bodies, server_logs, secret_file, "lynx", 2, 2)


@pytest.mark.extended
def test_lynx_mode_prefill_tp2_to_decode_tp2_equals_tp1(lynx_tp2, references):
    assert lynx_tp2["tp"] == (2, 2)
    assert_greedy_answers_equal(references["lynx"], lynx_tp2["answers"], "lynx tp2->tp2", references.continuation("lynx"))


@pytest.mark.extended
def test_tp2_decode_ranks_speculate_and_verify_together(lynx_tp2):
    metrics = [a["meta_info"]["lynx"] for a in lynx_tp2["answers"]]
    assert sum(m["speculative_tokens"] for m in metrics) > 0, metrics
    assert all(m["verify_batch"] >= 1 for m in metrics if m["speculative_tokens"]), metrics


@pytest.mark.extended
def test_tp2_decode_server_frees_every_kv_slot(lynx_tp2):
    before, after = lynx_tp2["free"]
    assert after == before


@pytest.mark.extended
@pytest.mark.parametrize("mode", ["bf16", "int8", "int4"])
def test_every_mode_prefill_tp2_to_decode_tp2_equals_a_tp2_server(
    model_path, bodies, server_logs, secret_file, references, mode
):
    """The pair answers exactly as one TP 2 server that round-trips each prompt's KV in the same
    mode (`bf16`: a plain one): every token equal, no near tie (the module docstring)."""
    reference = references.at(mode, tp=2)
    run = run_pair(model_path, bodies, server_logs, secret_file, mode, 2, 2)
    assert run["tp"] == (2, 2) and run["free"][1] == run["free"][0]

    def no_continuation() -> str:
        raise AssertionError(f"{mode} tp2->tp2 parted from the TP 2 server: no near tie is allowed here")

    tally = judge_answers(reference, run["answers"], no_continuation)
    print(f"\n{mode} tp2->tp2 against a TP 2 server: {tally.summary()}")
    assert tally.ok and not tally.partings, f"{mode} tp2->tp2: {tally.partings}"


@pytest.mark.extended
@pytest.mark.parametrize("mode", ["lynx", "int8"])
@pytest.mark.parametrize("prefill_tp,decode_tp", [(2, 1), (1, 2)], ids=["tp2->tp1", "tp1->tp2"])
def test_heterogeneous_tp_equals_tp1(
    model_path, bodies, server_logs, secret_file, references, mode, prefill_tp, decode_tp
):
    """Each decode rank gets exactly its heads: from both prefill ranks (2 -> 1), or its share of the
    one prefill rank's, which encodes each decode rank's heads apart (1 -> 2)."""
    reference = references[mode]
    run = run_pair(model_path, bodies, server_logs, secret_file, mode, prefill_tp, decode_tp)
    assert run["tp"] == (prefill_tp, decode_tp) and run["free"][1] == run["free"][0]
    label = f"{mode} tp{prefill_tp}->tp{decode_tp}"
    assert_greedy_answers_equal(reference, run["answers"], label, references.continuation(mode))
    if mode == "lynx":
        assert sum(a["meta_info"]["lynx"]["speculative_tokens"] for a in run["answers"]) > 0
