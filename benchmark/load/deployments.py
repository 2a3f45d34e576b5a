"""The deployments a serving-load run starts: one pair per mode (or two prefill servers and one
decode for fan-in), SGLang's stock Mooncake pair, and the single reference server the judge asks.

Lynx modes pace their own link (`--lynx-link-gbps`: the prefill sender's token bucket,
one link per prefill server, frames of `chunk_ms` on it). SGLang's stock backend
cannot be paced, so its pair crosses the same rate as kernel shaping (`tc`) of the
private network namespace's loopback; fan-in points use kernel shaping for every mode,
so both prefill servers' KV share one link into the decode server, as they share its NIC.
"""

from __future__ import annotations

import time
from pathlib import Path

from evaluation.deployments import STOCK_ENV, StockDeployment, http_ports, start
from evaluation.link import ShapedLoopback
from lynx.config import MAX_CHUNK_BYTES, MIN_CHUNK_BYTES
from lynx_deploy.deployment import PDDeployment
from lynx_deploy.processes import post_json
from lynx_deploy.server import CPU_MODEL_ARGS, SGLangServer
from lynx_deploy.streaming import stream_generate

from load.plan import STOCK_MODES, Link, base_mode, variant_args

MAX_TOTAL_TOKENS = 32768
CHUNKED_PREFILL = 512
SECRET_ARGS = ("--lynx-insecure",)  # one machine, loopback only


def server_args(profile) -> list[str]:
    return [*CPU_MODEL_ARGS, "--chunked-prefill-size", str(CHUNKED_PREFILL), "--mem-fraction-static", "0.5"]


def pair(mode: str, link: Link, profile, log_dir: Path, prefill_servers: int = 1, shaped: bool = False) -> PDDeployment:
    """The (not yet started) deployment of `mode`: paced by Lynx, or (`shaped`) left to the kernel's shaping."""
    kwargs = dict(log_dir=log_dir, max_total_tokens=MAX_TOTAL_TOKENS, extra_args=server_args(profile),
                  prefill_servers=prefill_servers)  # fmt: skip
    if mode in STOCK_MODES:
        kwargs["extra_args"] = [*kwargs["extra_args"], *STOCK_MODES[mode]]
        return StockDeployment(Path(profile.extra["model"]), env=STOCK_ENV, **kwargs)
    lynx_args = ["--lynx-mode", base_mode(mode), *variant_args(mode), *SECRET_ARGS, "--lynx-chunk-bytes",
                 str(link.chunk_bytes(profile.chunk_ms, MIN_CHUNK_BYTES, MAX_CHUNK_BYTES))]  # fmt: skip
    if not shaped:
        lynx_args += ["--lynx-link-gbps", str(link.gbps)]
    return PDDeployment(Path(profile.extra["model"]), lynx_args, **kwargs)


def start_pair(make, log) -> PDDeployment:
    """Start it (retrying while machine-wide memory accounting refuses a server)."""
    return start(make, log=log)


def shape(loopback: ShapedLoopback | None, pd: PDDeployment, gbps: float | None) -> None:
    """Shape the namespace's loopback to `gbps` (None: unshaped), the pair's HTTP ports exempt."""
    if loopback is None:
        if gbps is not None:
            raise RuntimeError("kernel shaping needs the private network namespace (run as root)")
        return
    ports = [*http_ports(pd), *(s.port for s in pd.prefills), *pd.bootstrap_ports]
    loopback.set_rate(gbps, exempt_ports=sorted(set(ports)))


def reference_server(model: Path, log_dir: Path) -> SGLangServer:
    """A single server whose prompts' KV round-trips through `int8`'s wire format (`--lynx-loopback`):
    it decodes as an int8 pair does, and answers the judge's continuations."""
    return SGLangServer(model, ["--lynx", "--lynx-loopback", "--lynx-mode", "int8", *CPU_MODEL_ARGS,
                                "--mem-fraction-static", "0.3"],
                        max_total_tokens=MAX_TOTAL_TOKENS, log_path=log_dir / "reference.log")  # fmt: skip


def prefill_seconds(server: SGLangServer, prompt_ids: list[int], repeats: int = 5) -> float:
    """Median time the single server takes for one prompt's prefill and its first token (after one
    untimed request: a server's first forwards are slower)."""
    times = []
    for i in range(-1, repeats):
        body = {"input_ids": [*prompt_ids[:-1], prompt_ids[-1] + i + 1],
                "sampling_params": {"max_new_tokens": 1, "temperature": 0}}  # fmt: skip
        server.flush_cache()
        started = time.perf_counter()
        post_json(f"{server.url}/generate", body)
        if i >= 0:
            times.append(time.perf_counter() - started)
    return sorted(times)[len(times) // 2]


def idle_ttft(pd: PDDeployment, prompt_ids: list[int], output_tokens: int, repeats: int = 3) -> dict:
    """Medians over `repeats` requests sent one at a time through the router: first token, last, anchor."""
    runs = []
    for i in range(repeats):
        body = {"input_ids": [*prompt_ids[:-1], prompt_ids[-1] + 100 + i],
                "sampling_params": {"max_new_tokens": output_tokens, "temperature": 0, "ignore_eos": True}}  # fmt: skip
        runs.append(stream_generate(f"{pd.url}/generate", body, nth=(1, output_tokens)))

    def median(key):
        values = [r[key] for r in runs if r.get(key) is not None]
        return sorted(values)[len(values) // 2] if values else None

    return {"ttft_s": median("ttft_s"), "e2e_s": median(f"t{output_tokens}_s"), "anchor_ready_s": median("anchor_ready_s")}
