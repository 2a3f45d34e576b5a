"""Client side of a streaming SGLang `/generate`: when did each output token arrive?"""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Iterator, Sequence


def sse_events(url: str, body: dict, timeout: float = 600.0) -> Iterator[dict]:
    """POST `body` with streaming on and yield each JSON event of the server-sent stream."""
    req = urllib.request.Request(
        url,
        data=json.dumps({**body, "stream": True}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        for raw in resp:
            line = raw.decode("utf-8", errors="replace").strip()
            if not line.startswith("data:"):
                continue
            payload = line[len("data:") :].strip()
            if payload == "[DONE]":
                return
            yield json.loads(payload)


def stream_generate(
    url: str, body: dict, nth: Sequence[int] = (1,), timeout: float = 600.0, outputs: bool = False
) -> dict:
    """Time a streaming `/generate` request.

    Returns ``ttft_s`` (first output token), ``t{n}_s`` for each n in `nth`
    (the n-th output token), ``prompt_tokens``, ``completion_tokens``, the
    final text, and the fields of ``meta_info["lynx"]`` when the server sent it;
    with `outputs`, also the final event's ``output_ids``, per-position top
    logprobs (``tops``, SGLang's triples) and the logprobs of the token ids the
    body asked for (``ids_tops``, the same triples; empty unless it asked).
    """
    start = time.perf_counter()
    result: dict = {}
    last: dict = {}
    for event in sse_events(url, body, timeout):
        now = time.perf_counter() - start
        if "error" in event:
            raise RuntimeError(f"server error: {event['error']}")
        meta = event.get("meta_info", {})
        count = meta.get("completion_tokens", 0)
        if count >= 1 and "ttft_s" not in result:
            result["ttft_s"] = now
        for n in nth:
            if count >= n and f"t{n}_s" not in result:
                result[f"t{n}_s"] = now
        if isinstance(meta.get("lynx"), dict):
            result.update(meta["lynx"])
        last = event
    meta = last.get("meta_info", {})
    result.update(
        prompt_tokens=meta.get("prompt_tokens"),
        completion_tokens=meta.get("completion_tokens"),
        text=last.get("text", ""),
    )
    if outputs:
        result.update(output_ids=list(last.get("output_ids") or []), tops=meta.get("output_top_logprobs") or [],
                      ids_tops=meta.get("output_token_ids_logprobs") or [])
    return result


def abandon(url: str, body: dict, after_events: int = 1, timeout: float = 600.0) -> int:
    """Start a streaming `/generate`, read `after_events` events, then hang up (a client abort).

    Returns how many events arrived before hanging up (fewer if the stream ended first).
    """
    seen = 0
    stream = sse_events(url, body, timeout)
    try:
        for _ in stream:
            seen += 1
            if seen >= after_events:
                break
    finally:
        stream.close()  # closes the connection: the server sees the client leave
    return seen
