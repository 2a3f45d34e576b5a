"""Residual decisions that every decode rank of a tensor-parallel group takes alike.

With `--tp-size` > 1 each decode rank receives the KV of its own heads in its
own transfer room, so its residual lands (or fails) at its own time. A verify
pass is a forward over the whole model, a collective of every rank: all ranks
must verify the same requests in the same iteration, and a request whose
residual failed on one rank must fail on all of them. `RankAgreement` turns
each rank's view of a list of requests (in adoption order, which SGLang keeps
alike on every rank: transfers commit after its own poll all-reduce) into the
group's: one MAX all-reduce of `Readiness` codes over the group's CPU (gloo)
group, as SGLang agrees on transfer polls (`disaggregation/utils.py`
`all_reduce_flags`). A single rank agrees with itself at no cost.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence


class Readiness(enum.IntEnum):
    """One rank's view of a request's residual; the group takes the largest (MAX)."""

    READY = 0  # every segment of the residual is applied on this rank
    PENDING = 1  # still arriving or being applied
    FAILED = 2  # failed, timed out or lost on this rank


class RankAgreement:
    """Agrees `Readiness` lists, and gathers failure reasons, across one TP group.

    Args:
        reduce_max: element-wise MAX of an int list over every rank (each rank
            passes a list of the same length, in the same order).
        gather: every rank's object, in rank order (all ranks call it together).
        size: ranks in the group.
    """

    def __init__(
        self,
        reduce_max: Callable[[list[int]], list[int]],
        gather: Callable[[object], list[object]],
        size: int,
    ) -> None:
        self._reduce_max, self._gather, self.size = reduce_max, gather, size

    @classmethod
    def solo(cls) -> RankAgreement:
        """A group of one rank."""
        return cls(lambda flags: flags, lambda obj: [obj], 1)

    @classmethod
    def of(cls, scheduler) -> RankAgreement:
        """The agreement over the scheduler's attention-TP CPU group (the group SGLang polls transfers over)."""
        group = getattr(scheduler, "attn_tp_cpu_group", None)
        if group is None:
            return cls.solo()
        import torch.distributed as dist
        from sglang.srt.disaggregation.utils import all_reduce_flags

        size = dist.get_world_size(group)
        if size == 1:
            return cls.solo()

        def gather(obj):
            out = [None] * size
            dist.all_gather_object(out, obj, group=group)
            return out

        return cls(lambda flags: all_reduce_flags(flags, group, dist.ReduceOp.MAX), gather, size)

    def agree(self, local: Sequence[Readiness]) -> list[Readiness]:
        """The group's readiness of each request: FAILED if it failed on any rank, else READY only
        if it is ready on every rank. Every rank must call this in the same iteration with the
        same requests in the same order (an empty list costs nothing and is never reduced)."""
        if not local:
            return []
        return [Readiness(code) for code in self._reduce_max([int(r) for r in local])]

    def reasons(self, local: Sequence[str | None]) -> list[str]:
        """For requests the group agreed FAILED (same list on every rank): each one's reason,
        this rank's own if it has one, else the first other rank's."""
        if self.size == 1:
            return [reason or "failed" for reason in local]
        ranks = self._gather(list(local))
        merged = []
        for index, own in enumerate(local):
            others = [r[index] for r in ranks if r[index] is not None]
            merged.append(own or (f"{others[0]} (on another decode rank)" if others else "failed on another rank"))
        return merged
