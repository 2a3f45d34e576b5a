"""Mooncake's published request trace (FAST'25), scaled to this machine, in bench_serving's `mooncake` format.

Each line of Mooncake's ``conversation_trace.jsonl`` is one request:
``timestamp`` (ms), ``input_length``, ``output_length`` and ``hash_ids``
(one id per 512-token block of the prompt; requests that share a prefix
share its leading ids). bench_serving's `mooncake` dataset replays such a
file with `--use-trace-timestamps`, building each prompt from its hash ids
(~130 tokens per id) in the chat template.

Scaling (`scale_trace`), from a window of consecutive requests:
* prompt: the leading ``k`` hash ids, ``k`` chosen so the window's median
  prompt is about `input_tokens` (a shared prefix stays shared), at most
  twice that (a 2-core CPU prefills 4k tokens in tens of seconds);
* output length: divided by the window median over `output_tokens`,
  clamped to [4, 4 x `output_tokens`];
* arrivals: the trace stamps arrivals in steps of about 3 s; the requests
  of one step are spread evenly up to the next, then every gap is
  stretched or shrunk by one factor so the window's mean rate is `rate`
  requests per second (busy steps stay busy).

The trace is not part of this repository: pass its path (it is in the
`kvcache-ai/Mooncake` repository, ``FAST25-release/traces/``), or let
bench_serving download it where the machine can reach GitHub.
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

TOKENS_PER_HASH_ID = 130  # what bench_serving's prompt builder makes of one hash id, chat template aside
TRACE_NAME = "conversation_trace.jsonl"


def read_trace(path: Path) -> list[dict]:
    rows = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    for row in rows:
        missing = {"timestamp", "input_length", "output_length", "hash_ids"} - set(row)
        if missing:
            raise ValueError(f"{path}: a row lacks {sorted(missing)}; is this a Mooncake trace?")
    return sorted(rows, key=lambda r: r["timestamp"])


def scale_trace(rows: list[dict], start: int, count: int, input_tokens: int, output_tokens: int, rate: float) -> list[dict]:
    """`count` requests from index `start`, scaled to this machine (see the module doc)."""
    window = rows[start : start + count + 1]  # one more: where the last step ends
    if len(window) < 3:
        raise ValueError(f"the trace has {len(rows)} rows; need at least 3 from index {start}")
    arrivals = spread_steps([r["timestamp"] for r in window])[:count]
    window = window[:count]
    median_blocks = statistics.median(len(r["hash_ids"]) for r in window)
    keep = max(1, round(input_tokens / TOKENS_PER_HASH_ID))
    shrink = max(1.0, median_blocks / keep)
    out_scale = statistics.median(r["output_length"] for r in window) / output_tokens
    span_ms = arrivals[-1] - arrivals[0]
    time_scale = (len(window) - 1) / rate * 1000 / span_ms if span_ms > 0 else 1.0
    scaled = []
    for r, arrival in zip(window, arrivals):
        blocks = min(2 * keep, max(1, math.ceil(len(r["hash_ids"]) / shrink)))
        scaled.append({
            "timestamp": round((arrival - arrivals[0]) * time_scale),
            "input_length": blocks * TOKENS_PER_HASH_ID,
            "output_length": min(4 * output_tokens, max(4, round(r["output_length"] / out_scale))),
            "hash_ids": r["hash_ids"][:blocks],
        })  # fmt: skip
    return scaled


def spread_steps(stamps: list[float]) -> list[float]:
    """Arrival times with the requests of each timestamp spread evenly up to the next distinct one
    (the last step keeps its stamps)."""
    out, i = [], 0
    while i < len(stamps):
        j = i
        while j < len(stamps) and stamps[j] == stamps[i]:
            j += 1
        step = (stamps[j] - stamps[i]) / (j - i) if j < len(stamps) else 0.0
        out += [stamps[i] + k * step for k in range(j - i)]
        i = j
    return out


def write_trace(rows: list[dict], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path

