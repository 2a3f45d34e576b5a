"""What a serving-load run measures: profiles, the link, the request rates, the points.

Rates are set as the *offered load on `int8`'s link*: the fraction of the
link's time that `int8`'s streams of the arriving requests would take
(``rate x int8 bytes per request / link rate``). Every mode runs at the same
request rates, so its own link utilization is that load scaled by its bytes.
The link itself is set from the machine: a measured prefill of one prompt and
the wanted ratio of BF16 transfer time to prefill time.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

STREAM_MODES = ("bf16", "int8", "int4", "lynx")  # the wire formats; `auto` sends lynx's or int8's bytes
LYNX_MODES = (*STREAM_MODES, "auto")
STOCK = "stock"
# SGLang's stock pair with an FP8 (e4m3) KV cache on both servers: the smallest KV format SGLang's
# own transfer sends (Hopper's; on this CPU its torch-native attention reads the FP8 cache back as BF16).
STOCK_FP8 = "stock-fp8"
STOCK_MODES = {STOCK: (), STOCK_FP8: ("--kv-cache-dtype", "fp8_e4m3")}
ALL_MODES = (*LYNX_MODES, *STOCK_MODES)
JUDGED_MODES = ("lynx", "auto")  # must equal int8's outputs token for token
REFERENCE_MODE = "int8"
# A mode may name a variant, ``MODE:VARIANT``: the same mode with these server options
# (the candidates a run compares, e.g. ``lynx:strict`` beside ``lynx``).
VARIANTS = {
    "strict": ("--lynx-residual-priority", "strict"),
    "deadline": ("--lynx-residual-priority", "deadline"),
    "finish": ("--lynx-residual-priority", "finish"),
    "cap8": ("--lynx-max-speculative-tokens", "8"),
    "cap32": ("--lynx-max-speculative-tokens", "32"),
}


def base_mode(mode: str) -> str:
    """`lynx` of ``lynx:strict``."""
    return mode.split(":", 1)[0]


def variant_args(mode: str) -> tuple[str, ...]:
    """The server options of `mode`'s variants (``lynx:strict:cap32`` -> both)."""
    return tuple(arg for name in mode.split(":")[1:] for arg in VARIANTS[name])


@dataclass(frozen=True)
class Profile:
    """One benchmark run's settings (see `PROFILES`; every field has a command-line option)."""

    modes: tuple[str, ...] = ALL_MODES
    loads: tuple[float, ...] = (0.3, 0.6, 0.85, 1.15)
    requests: int = 16
    light_requests: int = 10  # below half of int8's link a point lasts longest; fewer requests there
    input_tokens: int = 512
    output_tokens: int = 24
    bf16_over_prefill: float = 3.0
    chunk_ms: float = 10.0
    shared_prefix_load: float = 0.85
    shared_prefix_modes: tuple[str, ...] = ("int8", "lynx", "auto")
    trace_modes: tuple[str, ...] = ("int8", "lynx", "auto")
    trace_requests: int = 20
    fan_in_load: float = 0.85
    fan_in_modes: tuple[str, ...] = ("int8", "lynx")
    # The link-bound first token alone: one pair per mode, `idle_input_tokens`-token prompts on a slower
    # link where BF16's transfer is this multiple of their prefill, timed idle only (0: none).
    idle_bf16_over_prefill: float = 4.0
    idle_input_tokens: int = 2048
    idle_modes: tuple[str, ...] = ("int8", "lynx")
    seed: int = 7
    extra: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("modes", "shared_prefix_modes", "trace_modes", "fan_in_modes", "idle_modes"):
            modes = getattr(self, name)
            unknown = {base_mode(m) for m in modes} - set(ALL_MODES)
            unknown |= {v for m in modes for v in m.split(":")[1:] if v not in VARIANTS}
            if unknown:
                raise ValueError(f"{name}: unknown modes or variants {sorted(unknown)}; modes: {', '.join(ALL_MODES)}, "
                                 f"variants: {', '.join(VARIANTS)}")  # fmt: skip
        if not self.loads or any(not 0 < x < 5 for x in self.loads):
            raise ValueError(f"loads must be fractions of int8's link in (0, 5), got {self.loads}")
        if min(self.requests, self.light_requests, self.trace_requests) < 2:
            raise ValueError("a point needs at least 2 requests")
        if min(self.input_tokens, self.idle_input_tokens) < 64 or self.output_tokens < 2:
            raise ValueError("input_tokens and idle_input_tokens must be >= 64, output_tokens >= 2")
        if not self.bf16_over_prefill > 0 or not self.chunk_ms > 0 or not self.idle_bf16_over_prefill >= 0:
            raise ValueError("bf16_over_prefill and chunk_ms must be > 0, idle_bf16_over_prefill >= 0")
        if set(self.idle_modes) & set(STOCK_MODES):
            raise ValueError("idle_modes: the idle link-bound pairs are paced by Lynx; stock modes cannot be")
        if REFERENCE_MODE not in self.modes and set(JUDGED_MODES) & {base_mode(m) for m in self.modes}:
            raise ValueError("lynx and auto are judged against int8: include int8 in the modes")


PROFILES = {
    "default": Profile(),
    # A few minutes: two modes, two rates, no trace or fan-in (wiring checks, not results).
    "smoke": Profile(modes=("int8", "lynx"), loads=(0.3, 0.85), requests=6, light_requests=6, shared_prefix_modes=(),
                     trace_modes=(), fan_in_modes=(), idle_modes=()),  # fmt: skip
}


def requests_at(profile: Profile, load: float) -> int:
    """Requests of a point at `load` (fewer below half of int8's link, where arrivals are sparse)."""
    return profile.light_requests if load < 0.5 else profile.requests


def with_overrides(profile: Profile, **changes) -> Profile:
    """`profile` with the given fields replaced (None leaves a field as it is)."""
    return replace(profile, **{k: v for k, v in changes.items() if v is not None})


@dataclass(frozen=True)
class Link:
    """The emulated prefill->decode link of a run and the per-request bytes on it.

    Attributes:
        gbps: link rate in Gbit/s.
        prefill_s: measured prefill time of one prompt (idle single server).
        stream_bytes: per mode, the bytes one prompt's KV puts on the link.
    """

    gbps: float
    prefill_s: float
    stream_bytes: dict[str, int]

    @property
    def bytes_per_s(self) -> float:
        return self.gbps * 1e9 / 8

    def transfer_s(self, mode: str) -> float:
        return self.stream_bytes[mode] / self.bytes_per_s

    @property
    def bf16_over_prefill(self) -> float:
        return self.transfer_s("bf16") / self.prefill_s

    def rate_for(self, load: float) -> float:
        """Requests per second that put `load` of the link's time into int8's streams."""
        return load / self.transfer_s(REFERENCE_MODE)

    def utilization(self, mode: str, rate: float) -> float:
        """Offered load of `mode`'s own streams at `rate` requests per second."""
        return rate * self.transfer_s(mode)

    def chunk_bytes(self, chunk_ms: float, floor: int, ceiling: int) -> int:
        """Frame payload that takes `chunk_ms` on this link, within the option's bounds."""
        return max(floor, min(ceiling, int(self.bytes_per_s * chunk_ms / 1000)))

    def as_dict(self) -> dict:
        return {"gbps": self.gbps, "prefill_s": self.prefill_s, "stream_bytes": self.stream_bytes,
                "bf16_over_prefill": self.bf16_over_prefill}  # fmt: skip


def link_for(prefill_s: float, stream_bytes: dict[str, int], bf16_over_prefill: float) -> Link:
    """The link on which BF16's transfer of one prompt takes `bf16_over_prefill` x its prefill."""
    gbps = stream_bytes["bf16"] * 8 / (bf16_over_prefill * prefill_s) / 1e9
    return Link(float(f"{gbps:.6g}"), prefill_s, stream_bytes)


@dataclass(frozen=True)
class Point:
    """One bench_serving run: a mode's deployment at one request rate on one dataset."""

    mode: str
    dataset: str  # "random-ids", "generated-shared-prefix" or "trace"
    load: float | None  # offered load on int8's link (None for the trace: its own arrivals)
    topology: str = "1p1d"  # or "2p1d" (two prefill servers into one decode)

    @property
    def key(self) -> str:
        load = "trace" if self.load is None else f"{self.load:g}"
        return f"{self.topology}/{self.dataset}/{load}/{self.mode}"


def points(profile: Profile) -> list[Point]:
    """Every point of `profile`, grouped by deployment (mode, topology) in run order."""
    out = []
    for mode in profile.modes:
        out += [Point(mode, "random-ids", load) for load in profile.loads]
        if mode in profile.shared_prefix_modes:
            out.append(Point(mode, "generated-shared-prefix", profile.shared_prefix_load))
        if mode in profile.trace_modes:
            out.append(Point(mode, "trace", None))
    out += [Point(mode, "random-ids", profile.fan_in_load, "2p1d") for mode in profile.fan_in_modes]
    return out
