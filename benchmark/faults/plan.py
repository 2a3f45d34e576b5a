"""What a fault-under-load run does: the faults, the deployments they hit, the load beside them.

Every fault runs while `sglang.bench_serving` sends a Poisson load through the
router to a `lynx`-mode deployment whose link is slower than its prefill makes
KV, so the requests it hits are queued, on the wire, drafting on their anchors
or verifying. A deployment is one transport (ZeroMQ or Mooncake) and one or
three prefill servers feeding its one decode server (fan-in).
"""

from __future__ import annotations

from dataclasses import dataclass

# Run in this order on each deployment: `none` first, its idle levels are the baseline the others return to.
FAULTS = ("none", "abort", "stall", "drop", "kill-prefill", "kill-decode", "router")
TRANSPORTS = ("zmq", "mooncake")


@dataclass(frozen=True)
class Profile:
    """One run's settings (see `PROFILES`).

    Attributes:
        faults: injected on each deployment, in `FAULTS` order (`none` is always run first).
        transports, prefills: the deployments (every pair of the two).
        requests, rate: bench_serving's prompts per fault and its Poisson rate (requests/s).
        input_tokens, output_tokens: per prompt (`random-ids`, greedy, EOS ignored).
        link_gbps: each prefill server's paced link (slower than its prefill makes KV).
        transfer_timeout_s: the decode side's no-progress timeout (`--lynx-transfer-timeout`).
        fault_after_s: the fault comes this long after the first request reaches the decode server.
        aborts: client aborts of the `abort` fault, spread over the request states.
        soak_minutes: after the faults, rounds of load with client aborts for this long (`soak.py`).
    """

    faults: tuple[str, ...] = FAULTS
    transports: tuple[str, ...] = ("zmq",)
    prefills: tuple[int, ...] = (1,)
    requests: int = 24
    rate: float = 1.5
    input_tokens: int = 512
    output_tokens: int = 16
    link_gbps: float = 0.015
    transfer_timeout_s: float = 20.0
    fault_after_s: float = 6.0
    aborts: int = 6
    seed: int = 11
    soak_minutes: float = 0.0

    def __post_init__(self) -> None:
        unknown = (set(self.faults) - set(FAULTS)) | (set(self.transports) - set(TRANSPORTS))
        if unknown:
            raise ValueError(f"unknown faults or transports {sorted(unknown)}; faults: {', '.join(FAULTS)}; "
                             f"transports: {', '.join(TRANSPORTS)}")  # fmt: skip
        if not self.transports or not self.prefills or any(p < 1 for p in self.prefills):
            raise ValueError("a run needs a transport and prefill counts >= 1")
        if self.requests < 2 or not self.rate > 0 or not self.link_gbps > 0 or not self.transfer_timeout_s > 0:
            raise ValueError("requests must be >= 2 and rate, link_gbps, transfer_timeout_s > 0")
        if self.soak_minutes < 0:
            raise ValueError("soak_minutes must be >= 0")
        if self.input_tokens < 64 or self.output_tokens < 4:
            raise ValueError("input_tokens must be >= 64 and output_tokens >= 4")

    @property
    def ordered_faults(self) -> tuple[str, ...]:
        return tuple(f for f in FAULTS if f == "none" or f in self.faults)

    def deployments(self) -> list[tuple[str, int]]:
        return [(t, p) for t in self.transports for p in self.prefills]

    @property
    def load_window_s(self) -> float:
        """How long the arrivals last, on average."""
        return self.requests / self.rate


PROFILES = {
    # The whole matrix: both transports, one and three prefill servers.
    "full": Profile(transports=TRANSPORTS, prefills=(1, 3)),
    # One deployment (ZeroMQ, one prefill server), every fault.
    "default": Profile(),
    # An hour of load rounds with client aborts on one ZeroMQ pair: memory and slots must stay flat.
    "soak": Profile(faults=(), soak_minutes=60.0),
    # The default tier's representative: client aborts, a stalled prefill and dropped frames under a short
    # load, then one soak round (its other kinds of request beside the load).
    "smoke": Profile(faults=("abort", "stall", "drop"), requests=10, rate=1.0, aborts=3, soak_minutes=0.01),
}
