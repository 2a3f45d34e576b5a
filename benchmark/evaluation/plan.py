"""What the evaluation runs: the served variants, and per model the tasks, held-out text and speed points.

Two profiles: ``full`` (the documented run, aimed at under 45
minutes on a 2-core CPU) and ``smoke`` (the smallest end-to-end run, for the
test suite). Every number a run uses comes from here, so a report names its
plan.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from lynx_deploy.estimate import GEOMETRIES, KVGeometry
from lynx_deploy.server import CPU_MODEL_ARGS

# SGLang computes a chunk of this many prompt tokens per forward pass; Lynx
# (and SGLang's Mooncake backend) send each chunk's KV while the next runs.
CHUNK_TOKENS = 512
# Frames small enough that little residual sits in socket buffers ahead of an anchor (see link.py).
LYNX_CHUNK_BYTES = 128 << 10


@dataclass(frozen=True)
class Variant:
    """One served configuration of the PD pair.

    Attributes:
        name: label in the report (``lynx-2+6`` for the 2-bit anchor).
        mode, preset: the wire format (`lynx.kvwire.WireFormat.for_mode`);
            ``stock`` sends the KV as stored, like ``bf16``.
        stock: SGLang's own Mooncake backend over TCP, without `--lynx`.
    """

    name: str
    mode: str
    preset: str = "int8"
    stock: bool = False

    @property
    def speculates(self) -> bool:
        return self.mode == "lynx"

    def lynx_args(self) -> list[str]:
        if self.stock:
            return []
        args = ["--lynx-mode", self.mode, "--lynx-insecure", "--lynx-chunk-bytes", str(LYNX_CHUNK_BYTES)]
        if self.mode == "lynx":
            args += ["--lynx-preset", self.preset]
        return args


VARIANTS = {
    v.name: v
    for v in (
        Variant("bf16", "bf16"),
        Variant("stock", "bf16", stock=True),
        Variant("int8", "int8"),
        Variant("int4", "int4"),
        Variant("lynx", "lynx", "int8"),
        Variant("lynx-2+6", "lynx", "2+6"),
    )
}


@dataclass(frozen=True)
class ItemSpec:
    """One task item to generate: `task` in ``multikey``, ``needle``, ``passkey``, ``variable-tracking``."""

    task: str
    tokens: int
    seed: int
    depth: float = 0.5
    max_new_tokens: int = 16


@dataclass(frozen=True)
class ModelPlan:
    """Everything one model's evaluation runs.

    Attributes:
        model: `lynx_deploy.models` registry name.
        label: the model's name in the docs' tables.
        geometry: its KV shape (`lynx_deploy.estimate.GEOMETRIES`).
        server_args: extra arguments of every server.
        items: accuracy items, run on every Lynx variant.
        stock_items: how many of `items` (the first ones) the stock baseline runs.
        kl_windows, kl_context, kl_continuation: held-out Shakespeare windows
            for teacher-forced scoring.
        speed_tokens: prompt length of the speed rows.
        speed_ratios: BF16 transfer time over prefill time of each link rate.
        speed_repeats, speed_max_tokens, nth: requests per point, tokens, reported token indices.
        early_start: what of the next variant's pair starts while this one
            answers its (untimed) task items: ``pair`` (two pairs must fit in
            memory side by side), ``prefill`` (its prefill server only; the
            decode server and router start once this pair has stopped) or
            ``""`` (nothing).
    """

    model: str
    label: str
    geometry: KVGeometry
    server_args: tuple[str, ...]
    max_total_tokens: int
    items: tuple[ItemSpec, ...]
    stock_items: int
    kl_windows: int
    kl_context: int
    kl_continuation: int
    speed_tokens: int
    speed_ratios: tuple[float, ...]
    speed_repeats: int
    speed_max_tokens: int = 32
    nth: tuple[int, ...] = (1, 8, 32)
    early_start: str = ""
    notes: tuple[str, ...] = field(default=())


# The machine-wide 0.3 fraction would refuse a server while another pair holds
# memory (an early start), and leaves Qwen2.5-0.5B's fp32 weights no room;
# --max-total-tokens bounds the pool instead.
_SERVER_ARGS = (*CPU_MODEL_ARGS, "--chunked-prefill-size", str(CHUNK_TOKENS), "--mem-fraction-static", "0.8")
# Ratios of BF16 transfer to prefill time: about Llama-3.1-8B at 32k tokens on
# 10, 25 and 100 Gbit/s (docs/RESULTS.md, from lynx_deploy.estimate).
RATIOS = (2.0, 0.7, 0.2)


def _multikey(tokens: int, depths, seed: int) -> tuple[ItemSpec, ...]:
    return tuple(ItemSpec("multikey", tokens, seed + i, d) for i, d in enumerate(depths))


def full_plans() -> dict[str, ModelPlan]:
    smollm2 = ModelPlan(
        model="smollm2",
        label="SmolLM2",
        geometry=GEOMETRIES["smollm2-135m"],
        server_args=_SERVER_ARGS,
        max_total_tokens=16384,
        items=_multikey(1024, (0.1, 0.5, 0.9), 1100)
        + (ItemSpec("needle", 2048, 2100, 0.5), ItemSpec("passkey", 4096, 4100, 0.5)),
        stock_items=2,
        kl_windows=12,
        kl_context=1024,
        kl_continuation=64,
        speed_tokens=1024,
        speed_ratios=RATIOS,
        speed_repeats=2,
        early_start="pair",
    )
    qwen2 = ModelPlan(
        model="qwen2",
        label="Qwen2",
        geometry=GEOMETRIES["qwen2.5-coder-0.5b"],
        server_args=_SERVER_ARGS,
        max_total_tokens=8192,
        items=tuple(ItemSpec("variable-tracking", 1024, 3100 + i, max_new_tokens=40) for i in range(3))
        + _multikey(1024, (0.25, 0.75), 3200)
        + (ItemSpec("passkey", 2048, 3300, 0.5),),
        stock_items=2,
        kl_windows=10,
        kl_context=1024,
        kl_continuation=64,
        speed_tokens=512,
        speed_ratios=RATIOS,
        speed_repeats=2,
        # Two Qwen2 pairs do not fit in 24 GiB (one holds ~11.8 GB), a pair and a server do.
        early_start="prefill",
    )
    return {"smollm2": smollm2, "qwen2": qwen2}


def smoke_plans() -> dict[str, ModelPlan]:
    """The smallest end-to-end run: one short item, one held-out window, one speed point."""
    plans = {}
    for name, plan in full_plans().items():
        plans[name] = ModelPlan(
            model=plan.model,
            label=plan.label,
            geometry=plan.geometry,
            server_args=plan.server_args,
            max_total_tokens=4096,
            items=(ItemSpec("multikey", 512, 7, 0.5),),
            stock_items=1,
            kl_windows=2,
            kl_context=256,
            kl_continuation=16,
            speed_tokens=256,
            speed_ratios=(2.0,),
            speed_repeats=1,
            speed_max_tokens=8,
            nth=(1, 8),
            early_start=plan.early_start,
        )
    return plans


PROFILES = {"full": full_plans, "smoke": smoke_plans}
