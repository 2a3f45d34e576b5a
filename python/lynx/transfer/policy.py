"""What to send next, and how a stream is cut into chunks: pure functions, no sockets."""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Pending:
    """One queued chunk as the policy sees it.

    Attributes:
        priority: class, 0 first (see ``frames.priority_of``).
        seq: global arrival order; lower arrived earlier.
    """

    priority: int
    seq: int

    def __post_init__(self) -> None:
        for name in ("priority", "seq"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"{name} must be a non-negative int, got {value!r}")


def next_index(pending: Sequence[Pending]) -> int | None:
    """Index of the entry to send next, or None if ``pending`` is empty.

    Strict priority: the lowest class goes first whatever its arrival, so a new
    request's anchor overtakes older requests' queued residuals. FIFO (lowest
    ``seq``) within a class.
    """
    if not pending:
        return None
    return min(range(len(pending)), key=lambda i: (pending[i].priority, pending[i].seq))


def chunk_spans(total: int, chunk_bytes: int) -> list[tuple[int, int]]:
    """``(offset, length)`` spans, in order, covering ``total`` bytes exactly.

    Every span but the last is ``chunk_bytes`` long. An empty stream gives the
    single span ``(0, 0)``: it still has one chunk, whose arrival signals that
    the stream is complete.
    """
    if not isinstance(chunk_bytes, int) or chunk_bytes < 1:
        raise ValueError(f"chunk_bytes must be an int >= 1, got {chunk_bytes!r}")
    if not isinstance(total, int) or total < 0:
        raise ValueError(f"total must be a non-negative int, got {total!r}")
    if total == 0:
        return [(0, 0)]
    return [(offset, min(chunk_bytes, total - offset)) for offset in range(0, total, chunk_bytes)]


def check_layer_bounds(layer_bounds: Sequence[int], total: int) -> None:
    """Raise ValueError unless ``layer_bounds`` is ``[0, b1, ..., total]``, non-decreasing."""
    bounds = list(layer_bounds)
    if len(bounds) < 2 or bounds[0] != 0 or bounds[-1] != total:
        raise ValueError(f"layer_bounds must run from 0 to the stream size {total}, got {bounds[:3]}...{bounds[-2:]}")
    if any(b < a for a, b in zip(bounds, bounds[1:])):
        raise ValueError("layer_bounds must be non-decreasing")


def layers_of_span(offset: int, length: int, layer_bounds: Sequence[int]) -> tuple[int, int]:
    """Half-open range of layers whose bytes overlap ``[offset, offset + length)``.

    ``layer_bounds`` holds the cumulative byte bounds of the layers within the
    stream, ``[0, b1, ..., total]`` (layer ``l`` is ``[b_l, b_{l+1})``; empty
    layers are allowed). An empty span overlaps no layer: ``(k, k)`` with
    ``k`` the first layer starting at or after ``offset``.
    """
    num_layers = len(layer_bounds) - 1
    if num_layers < 1:
        raise ValueError("layer_bounds needs at least two entries, [0, total]")
    if offset < 0 or length < 0 or offset + length > layer_bounds[-1]:
        raise ValueError(f"span ({offset}, {length}) is outside the stream of {layer_bounds[-1]} bytes")
    if length == 0:
        first = min(bisect_left(layer_bounds, offset), num_layers)
        return first, first
    return bisect_right(layer_bounds, offset) - 1, bisect_left(layer_bounds, offset + length)
