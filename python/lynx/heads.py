"""Which KV heads each tensor-parallel rank holds, and which a prefill rank sends a decode rank.

With tensor parallelism every rank's KV cache holds a contiguous share of the
model's KV heads: local head ``j`` of rank ``r`` is head ``r * heads + j``,
where ``heads`` is the per-rank count. When the TP size does not divide the
head count, the engine may pad the heads with zero heads at the end (SGLang
does on CPUs: SmolLM2's 3 KV heads become 4 at TP 2, and rank 1 holds head 2
and a zero head), so a rank's range can reach past the model's ``real_heads``.
When there are fewer heads than ranks, an engine may instead replicate each
head over several ranks (``replicated``); heads then cannot be re-sliced.

The codec groups keys per (head, channel) over token blocks and values per
(token, head) over channel groups (`lynx.codec.quant`), so the KV of any range
of heads encodes, and decodes, independently of the others. A prefill rank
therefore sends each decode rank exactly the heads both hold: all of its own
when the two servers shard alike, else the overlap of the two ranges within
the real heads. A decode rank with more than one source (prefill TP > decode
TP) receives one transfer room per source, `transfer_room`.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import NamedTuple


@dataclass(frozen=True)
class HeadShard:
    """The KV heads of one attention-TP rank.

    Attributes:
        tp_size, tp_rank: the rank's attention-TP group size and its rank in it.
        heads: KV heads in this rank's cache (padding included).
        real_heads: the model's KV heads, before any padding.
        replicated: heads are replicated over ranks (fewer heads than ranks).
    """

    tp_size: int
    tp_rank: int
    heads: int
    real_heads: int
    replicated: bool = False

    def __post_init__(self) -> None:
        for name in ("tp_size", "heads", "real_heads"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        if not isinstance(self.tp_rank, int) or not 0 <= self.tp_rank < self.tp_size:
            raise ValueError(f"tp_rank must be in [0, {self.tp_size}), got {self.tp_rank!r}")
        if not self.replicated and self.heads * self.tp_size < self.real_heads:
            raise ValueError(f"{self.tp_size} ranks of {self.heads} heads cannot hold {self.real_heads} heads")

    @property
    def first(self) -> int:
        """The (padded) index of this rank's first head."""
        return self.tp_rank * self.heads

    @property
    def end(self) -> int:
        return self.first + self.heads

    def same_layout(self, other: HeadShard) -> bool:
        """Whether `other` shards the heads exactly as this rank's group does."""
        return (self.tp_size, self.heads, self.real_heads, self.replicated) == (
            other.tp_size, other.heads, other.real_heads, other.replicated,
        )  # fmt: skip


class HeadSlice(NamedTuple):
    """The heads a prefill rank sends one decode rank: ``count`` heads from (padded) head ``first``,
    which are the sender's local heads from ``first - sender.first``."""

    first: int
    count: int


def heads_to_send(src: HeadShard, dst: HeadShard) -> HeadSlice:
    """The heads prefill rank `src` sends decode rank `dst`.

    Servers that shard alike exchange every head of a rank (padding and
    replicas included); otherwise the overlap of the two ranges within the
    model's real heads. ValueError names why `src` cannot serve `dst` (a
    replicated layout, other models, or no head in common).
    """
    if src.same_layout(dst):
        return HeadSlice(src.first, src.heads)
    if src.real_heads != dst.real_heads:
        raise ValueError(f"the prefill's model has {src.real_heads} KV heads, the decode's {dst.real_heads}")
    if src.replicated or dst.replicated:
        raise ValueError(
            f"KV heads replicated over ranks ({src.real_heads} heads at prefill TP {src.tp_size}, decode TP "
            f"{dst.tp_size}) cannot be re-sliced; run both servers with the same --tp-size"
        )
    first, end = max(src.first, dst.first), min(src.end, dst.end, src.real_heads)
    if end <= first:
        raise ValueError(
            f"prefill rank {src.tp_rank} of {src.tp_size} holds heads [{src.first}, {src.end}), decode rank "
            f"{dst.tp_rank} of {dst.tp_size} needs [{dst.first}, {min(dst.end, dst.real_heads)}): none in common"
        )
    return HeadSlice(first, end - first)


def placement(dst: HeadShard, first: int, count: int) -> int:
    """The local index at which decode rank `dst` stores `count` heads from (padded) head `first`;
    ValueError if they are not all its own."""
    if count < 1 or first < dst.first or first + count > dst.end:
        raise ValueError(
            f"heads [{first}, {first + count}) announced, this decode rank holds [{dst.first}, {dst.end})"
        )
    return first - dst.first


def uncovered(dst: HeadShard, slices: list[HeadSlice]) -> list[int]:
    """The real heads of decode rank `dst` that none of `slices` carries (all carried: [])."""
    carried = {h for s in slices for h in range(s.first, s.first + s.count)}
    needed = range(dst.first, min(dst.end, dst.real_heads)) if not dst.replicated else range(dst.first, dst.end)
    return [h for h in needed if h not in carried]


def coverage_problem(dst: HeadShard, slices: list[HeadSlice]) -> str | None:
    """Why the heads that every source of decode rank `dst` announced are not exactly its heads, or None."""
    carried = [h for s in slices for h in range(s.first, s.first + s.count)]
    if len(carried) != len(set(carried)):
        return f"the prefill ranks announced overlapping KV heads {sorted(slices)}"
    missing = uncovered(dst, slices)
    if missing:
        return f"no prefill rank sends KV heads {missing} of this decode rank (heads sent: {sorted(slices)})"
    return None


def sources(src_tp: int, dst_tp: int) -> int:
    """How many prefill ranks send each decode rank its heads (SGLang pairs ranks this way)."""
    return src_tp // dst_tp if src_tp > dst_tp else 1


def transfer_room(room: int, part: int) -> int:
    """The wire id of part `part` of a decode rank's transfer of request `room` (part 0: `room`)."""
    if part == 0:
        return room
    digest = hashlib.blake2b(f"lynx-heads:{room}:{part}".encode(), digest_size=8).digest()
    return (int.from_bytes(digest, "little") & ((1 << 63) - 1)) or 1


def part_of(src: HeadShard, dst_tp: int) -> int:
    """Which part of its decode rank's transfer prefill rank `src` sends (its index among the sources)."""
    return src.tp_rank % sources(src.tp_size, dst_tp)
