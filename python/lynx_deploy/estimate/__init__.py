"""Cluster-scale TTFT estimate per `--lynx-mode` (the model in `model`, the command in `cli`)."""

from lynx_deploy.estimate.cli import main
from lynx_deploy.estimate.model import (
    COMPUTE_SHAPES,
    DTYPES,
    GEOMETRIES,
    MODES,
    KVGeometry,
    ModeEstimate,
    Scenario,
    chunk_units,
    estimate,
    mode_streams,
    overlapped_s,
    prefill_tok_s_from_flops,
    sequential_s,
)

__all__ = [
    "COMPUTE_SHAPES", "DTYPES", "GEOMETRIES", "MODES", "KVGeometry", "ModeEstimate", "Scenario", "chunk_units",
    "estimate", "main", "mode_streams", "overlapped_s", "prefill_tok_s_from_flops", "sequential_s",
]
