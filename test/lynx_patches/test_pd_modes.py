"""Real prefill/decode pairs with the lynx backend behind SGLang's router, one per mode.

Every mode runs the same long prompts (1k-4k tokens of essay text) through
the `smg` router with greedy decoding. Servers compute in fp32 with a bf16 KV
cache (`CPU_ARGS`: this CPU runs bf16 matmuls 6x slower than fp32), so the KV
that crosses the link is bf16. References, all exact token equality:

* ``bf16``: a single (non-disaggregated) server;
* ``int8``: a single server with `--lynx-loopback --lynx-mode int8`, which
  round-trips each prompt's KV through the int8 wire format in-process right
  after prefill: what decode should compute if the transfer is right;
* ``lynx`` (int8 preset, anchor then residual): ``int8`` mode, because both
  land bit-identical KV;
* ``int4``: runs and answers (it is the lossy baseline).
"""

from __future__ import annotations

import secrets
import time

import pytest
from openai import OpenAI

from lynx.prompts import long_question
from lynx_patches.deploy import PDDeployment
from lynx_patches.launch import SGLangServer

PROMPT_TOKENS = (1024, 2048, 3584)
MAX_TOKENS = 24
MODES = ("bf16", "int8", "lynx", "int4")
CPU_ARGS = ("--dtype", "float32", "--kv-cache-dtype", "bfloat16")


def _chat(url: str, content: str) -> tuple[list[int], list[int], str]:
    client = OpenAI(base_url=f"{url}/v1", api_key="unused", timeout=600)
    reply = client.chat.completions.create(
        model="smollm2",
        messages=[{"role": "user", "content": content}],
        max_tokens=MAX_TOKENS,
        temperature=0,
        extra_body={"return_prompt_token_ids": True, "return_token_ids": True},
    )
    choice = reply.choices[0]
    return (
        choice.model_extra["prompt_token_ids"],
        choice.model_extra["response_token_ids"],
        choice.message.content,
    )


def _lynx_state(server) -> dict:
    return server.get_json("/server_info")["internal_states"][0]["lynx"]


def _settled_state(server, like: dict, wait_s: float = 20.0) -> dict:
    """The decode server's Lynx state once its free slots are back to `like`'s (or after `wait_s`)."""
    deadline = time.monotonic() + wait_s
    state = _lynx_state(server)
    while state["kv_free_slots"] != like["kv_free_slots"] and time.monotonic() < deadline:
        time.sleep(0.5)
        state = _lynx_state(server)
    return state


@pytest.fixture(scope="module")
def questions(model_path) -> list[str]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_path))
    return [long_question(tokenizer, n, index=i) for i, n in enumerate(PROMPT_TOKENS)]


@pytest.fixture(scope="module")
def single_server_outputs(model_path, questions, server_logs):
    """Outputs of single servers: plain, and with the int8 loopback."""
    outputs = {}
    for name, args in (("plain", []), ("int8-loopback", ["--lynx-mode", "int8", "--lynx-loopback"])):
        with SGLangServer(
            model_path,
            ["--lynx", *args, "--served-model-name", "smollm2", *CPU_ARGS],
            log_path=server_logs / f"single-{name}.log",
        ) as server:
            outputs[name] = [_chat(server.url, q) for q in questions]
    return outputs


@pytest.fixture(scope="module")
def pd_runs(model_path, questions, server_logs):
    """Per mode: the outputs through the router, and the decode server's free slots before/after."""
    secret = server_logs / "pd-secret"
    secret.write_text(secrets.token_hex(32))
    runs = {}
    for mode in MODES:
        with PDDeployment(
            model_path,
            ["--lynx-mode", mode, "--lynx-secret-file", str(secret)],
            extra_args=CPU_ARGS,
            log_dir=server_logs / f"pd-{mode}",
        ) as pd:
            before = _lynx_state(pd.decode)
            outputs = [_chat(pd.url, q) for q in questions]
            after = _settled_state(pd.decode, before)
            runs[mode] = {"outputs": outputs, "before": before, "after": after}
    return runs


def _tokens(outputs) -> list[list[int]]:
    return [tokens for _, tokens, _ in outputs]


def test_bf16_mode_equals_single_server_exactly(pd_runs, single_server_outputs):
    plain = single_server_outputs["plain"]
    assert [p for p, _, _ in pd_runs["bf16"]["outputs"]] == [p for p, _, _ in plain]
    assert _tokens(pd_runs["bf16"]["outputs"]) == _tokens(plain)


def test_int8_mode_equals_single_server_on_int8_roundtripped_kv(pd_runs, single_server_outputs):
    assert _tokens(pd_runs["int8"]["outputs"]) == _tokens(single_server_outputs["int8-loopback"])


def test_lynx_mode_equals_int8_mode_exactly(pd_runs):
    assert _tokens(pd_runs["lynx"]["outputs"]) == _tokens(pd_runs["int8"]["outputs"])


def test_int4_mode_answers(pd_runs):
    for _, tokens, text in pd_runs["int4"]["outputs"]:
        assert tokens and text.strip()


@pytest.mark.parametrize("mode", MODES)
def test_decode_server_frees_every_kv_slot(pd_runs, mode):
    run = pd_runs[mode]
    assert run["after"]["kv_free_slots"] == run["before"]["kv_free_slots"]
    assert run["after"]["req_rows_free"] == run["before"]["req_rows_free"]
