"""Failures of a real prefill/decode pair: each fails its request with a clear error,
the servers keep serving, and the decode server's KV slots all come back.

The link is paced slowly (`SLOW_LINK_GBPS`) so that a ~1k-token request's
int8 KV (about 13 MB) is still on the wire when the failure strikes. Requests
go straight to both servers (`generate_direct`) so the test knows their
bootstrap room and can forge frames for it.
"""

from __future__ import annotations

import json
import re
import secrets
import threading
import time

import pytest

from lynx_testing.prompts import chat_prompt, long_question
from lynx.transfer.frames import FrameHeader, encode_frame
from lynx.transfer.zmq_transport import ZmqTransport
from lynx_testing.deploy import PDDeployment
from lynx_testing.launch import SGLangServer, post_json
from lynx_testing.streaming import sse_events

SLOW_LINK_GBPS = 0.002  # 250 kB/s: a 1k-token request's KV needs ~50 s
TIMEOUT_S = 25
CPU_ARGS = ("--dtype", "float32", "--kv-cache-dtype", "bfloat16")
SMALL = {"text": "Say hello.", "sampling_params": {"max_new_tokens": 4, "temperature": 0}}


def _room() -> int:
    return secrets.randbelow(2**62) + 1


def _lynx_state(server) -> dict:
    return server.get_json("/server_info")["internal_states"][0]["lynx"]


def _wait_free(server, want: int, wait_s: float = 30.0) -> int:
    deadline = time.monotonic() + wait_s
    free = _lynx_state(server)["kv_free_slots"]
    while free != want and time.monotonic() < deadline:
        time.sleep(0.5)
        free = _lynx_state(server)["kv_free_slots"]
    return free


def _data_endpoint(decode: SGLangServer) -> str:
    match = re.search(r"Lynx decode: receiving KV on (tcp://\S+)", decode.log_path.read_text())
    assert match, "decode server did not log its data endpoint"
    return match.group(1)


@pytest.fixture(scope="module")
def secret_file(server_logs):
    path = server_logs / "failures-secret"
    path.write_bytes(secrets.token_bytes(32).hex().encode())
    return path


@pytest.fixture(scope="module")
def long_body(model_path) -> dict:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_path))
    text = chat_prompt(tokenizer, long_question(tokenizer, 1024))
    return {"text": text, "sampling_params": {"max_new_tokens": 8, "temperature": 0}}


@pytest.fixture(scope="module")
def slow_pd(model_path, server_logs, secret_file):
    lynx_args = [
        "--lynx-mode", "int8",
        "--lynx-link-gbps", str(SLOW_LINK_GBPS),
        "--lynx-transfer-timeout", str(TIMEOUT_S),
        "--lynx-secret-file", str(secret_file),
    ]  # fmt: skip
    with PDDeployment(model_path, lynx_args, extra_args=CPU_ARGS, log_dir=server_logs / "pd-slow") as pd:
        yield pd


def _serves_small_request(pd: PDDeployment) -> None:
    prefill, decode = pd.generate_direct(SMALL, _room())
    assert isinstance(decode, dict) and decode["text"].strip(), decode


def test_request_whose_kv_is_late_fails_with_timeout_error(slow_pd, long_body):
    free = _lynx_state(slow_pd.decode)["kv_free_slots"]
    _, decode = slow_pd.generate_direct(long_body, _room())
    assert isinstance(decode, str), "a request whose KV needs ~50 s must not succeed within 25 s"
    assert f"did not arrive within {TIMEOUT_S}s" in decode
    assert "Traceback" not in decode
    assert _wait_free(slow_pd.decode, free) == free
    _serves_small_request(slow_pd)


def _forged_frames(room: int, key: bytes, wrong_key: bytes) -> dict[str, list]:
    payload = bytes(1024)
    header = FrameHeader(room=room, stream=0, chunk_index=0, num_chunks=1, offset=0, length=len(payload), layer_start=0, layer_end=1)
    corrupt = encode_frame(header, payload, key)
    corrupt[1] = bytes([1]) + bytes(corrupt[1])[1:]
    big = bytes((1 << 20) + 64)
    oversized = FrameHeader(room=room, stream=0, chunk_index=0, num_chunks=1, offset=0, length=len(big), layer_start=0, layer_end=1)
    return {
        "unauthenticated": encode_frame(header, payload, wrong_key),
        "corrupt": corrupt,
        "oversized": encode_frame(oversized, big, key),
    }


@pytest.mark.parametrize(
    "kind,reason",
    [("unauthenticated", "FrameAuth|MAC|secret"), ("corrupt", "FrameAuth|MAC|corrupt"), ("oversized", "more than the allowed")],
)
def test_bad_frame_fails_its_request_with_the_reason(slow_pd, long_body, secret_file, kind, reason):
    free = _lynx_state(slow_pd.decode)["kv_free_slots"]
    room = _room()
    frames = _forged_frames(room, secret_file.read_bytes().strip(), secrets.token_bytes(32))
    transport = ZmqTransport(send_timeout_s=10)
    endpoint = _data_endpoint(slow_pd.decode)
    try:
        _, decode = slow_pd.generate_direct(
            long_body, room, after_prefill=lambda: transport.send(endpoint, frames[kind])
        )
    finally:
        transport.close()
    assert isinstance(decode, str), f"a {kind} frame must fail the request"
    assert "rejected frame" in decode and re.search(reason, decode), decode
    assert _wait_free(slow_pd.decode, free) == free
    _serves_small_request(slow_pd)


def test_killing_prefill_mid_transfer_fails_the_request_and_decode_keeps_serving(
    model_path, server_logs, secret_file, long_body
):
    lynx_args = [
        "--lynx-mode", "int8",
        "--lynx-link-gbps", str(SLOW_LINK_GBPS),
        "--lynx-transfer-timeout", "120",
        "--lynx-secret-file", str(secret_file),
    ]  # fmt: skip
    with PDDeployment(model_path, lynx_args, extra_args=CPU_ARGS, log_dir=server_logs / "pd-kill") as pd:
        free = _lynx_state(pd.decode)["kv_free_slots"]
        _, decode = pd.generate_direct(long_body, _room(), after_prefill=lambda: (time.sleep(2), pd.prefill.stop(grace=0)))
        assert isinstance(decode, str), "the request must fail once its prefill server is gone"
        assert "prefill" in decode.lower() and "Traceback" not in decode, decode
        assert _wait_free(pd.decode, free) == free
        pd.prefill = SGLangServer(
            model_path, pd.prefill.command[pd.prefill.command.index("--lynx") :], log_path=server_logs / "pd-kill" / "prefill-2.log"
        )
        pd.prefill.start().wait_ready()
        _serves_small_request(pd)


def test_lynx_request_whose_residual_never_arrives_fails_without_unverified_tokens(
    model_path, server_logs, secret_file, long_body
):
    """The anchor lands and decoding starts on it; then the prefill dies with the residual
    still on the wire. The client must have received only the exact first token, then an
    error, and the decode server must free every slot and keep serving."""
    lynx_args = [
        "--lynx-mode", "lynx",
        "--lynx-link-gbps", "0.01",
        "--lynx-transfer-timeout", "120",
        "--lynx-secret-file", str(secret_file),
    ]  # fmt: skip
    with PDDeployment(model_path, lynx_args, extra_args=CPU_ARGS, log_dir=server_logs / "pd-lynx-kill") as pd:
        free = _lynx_state(pd.decode)["kv_free_slots"]
        room = _room()
        fields = {"bootstrap_host": "127.0.0.1", "bootstrap_port": pd.bootstrap_port, "bootstrap_room": room}
        body = {**long_body, **fields, "sampling_params": {"max_new_tokens": 64, "temperature": 0}}
        prefill = threading.Thread(target=_post_quietly, args=(f"{pd.prefill.url}/generate", body))
        prefill.start()
        tokens_streamed, error = 0, None
        try:
            for event in sse_events(f"{pd.decode.url}/generate", body):
                meta = event.get("meta_info", {})
                if "error" in event or (meta.get("finish_reason") or {}).get("type") == "abort":
                    error = json.dumps(event)
                    break
                tokens_streamed = meta.get("completion_tokens", tokens_streamed)
                if tokens_streamed >= 1 and pd.prefill.process is not None:
                    pd.prefill.stop(grace=0)  # the anchor landed: kill the residual's sender
        except OSError as exc:
            error = str(exc)
        prefill.join(timeout=60)
        assert error is not None, "the request must fail once its residual can no longer arrive"
        assert "residual" in error, error
        assert tokens_streamed == 1, "only the prefill's exact first token may have been streamed"
        assert _wait_free(pd.decode, free) == free
        decode_log = pd.decode.log_path.read_text()
        assert "failed: residual KV failed" in decode_log


def _post_quietly(url: str, body: dict) -> None:
    try:
        post_json(url, body, timeout=120)
    except OSError:
        pass  # the prefill server is killed while answering
