"""Lynx's Prometheus metrics (`lynx:*`), exported through SGLang's `/metrics` when `--enable-metrics` is on.

Created in the decode scheduler process after SGLang has set up
prometheus_client's multiprocess directory, like SGLang's own collectors.
"""

from __future__ import annotations

# Up to ten minutes: on a slow or shared link a residual can take minutes to land.
LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 25, 60, 120, 300, 600)


class LynxMetrics:
    def __init__(self, mode: str) -> None:
        from prometheus_client import Counter, Histogram

        self.labels = {"mode": mode}
        names = list(self.labels)
        self.requests = Counter("lynx:requests_total", "Requests decoded on Lynx-transferred KV.", names)
        self.speculative = Counter(
            "lynx:speculative_tokens_total", "Tokens generated on anchor-only KV and verified.", names
        )
        self.accepted = Counter("lynx:accepted_tokens_total", "Speculative tokens kept by verification.", names)
        self.rollbacks = Counter("lynx:rollbacks_total", "Verifications that discarded tokens.", names)
        self.anchor_ready = Histogram(
            "lynx:anchor_ready_seconds", "Request arrival to anchor landed.", names, buckets=LATENCY_BUCKETS
        )
        self.residual_ready = Histogram(
            "lynx:residual_ready_seconds", "Request arrival to residual landed.", names, buckets=LATENCY_BUCKETS
        )
        self.verify = Histogram("lynx:verify_seconds", "Residual upgrade plus verify pass.", names, buckets=LATENCY_BUCKETS)

    def record(self, metrics: dict) -> None:
        """Account one finished request's `meta_info["lynx"]` snapshot."""
        self.requests.labels(**self.labels).inc()
        self.speculative.labels(**self.labels).inc(metrics.get("speculative_tokens", 0))
        self.accepted.labels(**self.labels).inc(metrics.get("accepted_tokens", 0))
        self.rollbacks.labels(**self.labels).inc(metrics.get("rollbacks", 0))
        for key, histogram in (
            ("anchor_ready_s", self.anchor_ready),
            ("residual_ready_s", self.residual_ready),
            ("verify_s", self.verify),
        ):
            if metrics.get(key) is not None:
                histogram.labels(**self.labels).observe(metrics[key])
