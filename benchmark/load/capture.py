"""Run SGLang's own serving benchmark and keep each request's tokens.

    python benchmark/load/capture.py RUNS.json

RUNS.json lists runs, each ``{"records": PATH, "argv": [...]}`` with
`sglang.bench_serving`'s own command-line options; they run one after
another in this process (its imports take ~20 s here, once).

`sglang.bench_serving` measures TTFT, TPOT, ITL and end-to-end latency but
keeps only each answer's text. This runs its command line unchanged (its
dataset, arrivals, client and metrics) and records beside it, per request,
what the server streamed in its last event: the output token ids, the top
log-probabilities per position (with ``--return-logprob --top-logprobs-num
2``) and ``meta_info`` (Lynx's per-request metrics among them), with the
prompt and the client's own timings. One JSON object per line, in completion
order; the judge needs the tokens, the timelines need the rest.

SGLang's router sends an SSE comment (``: ping``) on a stream that has been
quiet for a while (a request queued behind others); bench_serving's `sglang`
client parses every line as JSON and would fail the request, so the parser
it is given reads a comment as an empty event, which the client skips.
"""

from __future__ import annotations

import contextvars
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

_LAST_EVENT: contextvars.ContextVar[list | None] = contextvars.ContextVar("last_event", default=None)


class _RecordingJson:
    """Stands in for the `orjson` module inside bench_serving: parses as it does and keeps the
    request's last parsed event (the context variable is per asyncio task, i.e. per request)."""

    def __init__(self, real) -> None:
        self._real = real

    def loads(self, data):
        if data[:1] in (b":", ":"):  # an SSE comment (smg's ": ping" on a quiet stream): an event with nothing
            return {}
        holder = _LAST_EVENT.get()
        try:
            value = self._real.loads(data)
        except Exception:
            if holder is not None:  # what the stream carried instead of JSON (an error text from the router)
                holder[1] = bytes(data[:300]).decode(errors="replace")
            raise
        if holder is not None and isinstance(value, dict) and "meta_info" in value:
            holder[0] = value
        elif holder is not None and isinstance(value, dict) and "error" in value:  # the server's error event
            holder[1] = json.dumps(value["error"])[:300]
        return value

    def __getattr__(self, name):
        return getattr(self._real, name)


def _record(event: dict | None, request_input, output, started_wall: float) -> dict:
    meta = (event or {}).get("meta_info", {})
    prompt = request_input.prompt
    return {
        "prompt_ids": prompt if isinstance(prompt, list) else None,
        "prompt_text": prompt if isinstance(prompt, str) else None,
        "prompt_len": request_input.prompt_len,
        "output_len": request_input.output_len,
        "success": output.success,
        "error": output.error.replace(f"{ROOT}/", "")[-2000:] if output.error else "",  # no machine path in results
        "start_s": output.start_time,
        "started_wall": started_wall,
        "ttft_s": output.ttft,
        "latency_s": output.latency,
        "itl_s": output.itl,
        "output_ids": (event or {}).get("output_ids"),
        "top2": [[[lp, tok] for lp, tok, *_ in position[:2]] for position in meta.get("output_top_logprobs") or []],
        "finish_reason": meta.get("finish_reason"),
        "prompt_tokens": meta.get("prompt_tokens"),
        "completion_tokens": meta.get("completion_tokens"),
        "cached_tokens": meta.get("cached_tokens"),
        "e2e_latency_s": meta.get("e2e_latency"),
        "lynx": meta.get("lynx"),
    }


class _Sink:
    """Where the records of the running run go."""

    file = None


def install(sink: _Sink) -> None:
    """Wrap bench_serving's request functions and JSON parser so each request is recorded in `sink`."""
    from sglang.benchmark import serving

    serving.orjson = _RecordingJson(serving.orjson)

    def wrap(original):
        async def recorded(request_func_input, pbar=None):
            holder: list = [None, None]
            token = _LAST_EVENT.set(holder)
            started_wall = time.time()
            try:
                output = await original(request_func_input=request_func_input, pbar=pbar)
            finally:
                _LAST_EVENT.reset(token)
            record = _record(holder[0], request_func_input, output, started_wall)
            if holder[1] is not None:
                record["error"] = f"the stream carried {holder[1]!r}; " + record["error"]
            sink.file.write(json.dumps(record) + "\n")
            sink.file.flush()
            return output

        return recorded

    for name in ("sglang", "sglang-native"):
        serving.ASYNC_REQUEST_FUNCS[name] = wrap(serving.ASYNC_REQUEST_FUNCS[name])


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    runs = json.loads(Path(argv[0]).read_text())
    sink = _Sink()
    install(sink)
    from sglang.benchmark.serving import cli_main

    for run in runs:
        with open(run["records"], "w") as sink.file:
            sys.argv = ["sglang.bench_serving", *run["argv"]]
            cli_main()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
