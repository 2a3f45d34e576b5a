"""When a queued residual goes ahead of newer anchors: each request's residual has a deadline.

Strict anchor priority lets a new request's anchor overtake every older
request's residual. Under load that starves the residuals: an older request
drafts its speculative cap on the anchor, then waits, and finishes later
than it would have without Lynx. So once a request's anchor has left, its
residual (every later stage) gets a deadline: the anchor's departure plus the
request's draft window, the time the decode server can usefully draft on the
anchor. Anchors still go first while every queued residual can meet its
deadline behind them; the moment sending one more anchor chunk would make a
residual late, the oldest residual goes instead (earliest deadline first:
residuals leave in their queue order, which is their deadlines' order).

With ``finish`` (``--lynx-residual-priority finish``) and a paced link, a
residual is due instead when a first-come-first-served sender would have sent
its request's last byte (a virtual clock that adds each chunk's bytes at the
link's rate as it is queued: what the request's one stream would have met
without priorities), plus half the draft window. The drafts save the decode
server a window of steps; the other half covers the verify pass and slower
steps, so the request ends no later than its one stream would have let it.
In a burst this deadline moves back with the queue, so newer anchors keep
going first where the anchor-relative deadline would hold them. Unpaced (the
link's rate unknown), ``finish`` falls back to the anchor-relative deadline.

Bookkeeping only, no lock and no thread: the sender calls it under its lock.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

ANCHOR_CLASS = 0  # priority class of anchors and request metadata; later classes are residual stages
# Requests whose anchor departure is remembered after their queue emptied (a residual
# segment may be queued after its anchor has left).
REMEMBERED_ROOMS = 4096
FINISH_SLACK_SHARE = 0.5  # finish: the share of the draft window a residual may land after its FIFO finish


@dataclass(frozen=True)
class Backlog:
    """One request's queued residual bytes and when they must have left (None: its anchor has not)."""

    room: int
    nbytes: int
    deadline: float | None


def residual_due(backlogs: Sequence[Backlog], anchor_bytes: int, now: float, bytes_per_s: float | None) -> bool:
    """Whether sending `anchor_bytes` of anchor next would make a queued residual miss its deadline.

    `backlogs` are in the order the residuals leave. With the link's rate
    known, residual ``k`` would finish ``(anchor_bytes + bytes of residuals
    0..k) / bytes_per_s`` from `now`; without it (an unpaced link), a
    residual is due once its deadline has passed.
    """
    total = anchor_bytes
    for backlog in backlogs:
        total += backlog.nbytes
        if backlog.deadline is None:
            continue
        late = now + total / bytes_per_s > backlog.deadline if bytes_per_s else now >= backlog.deadline
        if late:
            return True
    return False


class _Room:
    __slots__ = ("anchor_chunks", "residual_bytes", "anchor_left_at", "window_s", "fifo_finish")

    def __init__(self, window_s: float) -> None:
        self.anchor_chunks = 0
        self.residual_bytes = 0
        self.anchor_left_at: float | None = None
        self.window_s = window_s
        self.fifo_finish: float | None = None  # finish: when a FIFO sender would have sent its last byte

    @property
    def idle(self) -> bool:
        return self.anchor_chunks <= 0 and self.residual_bytes <= 0


class ResidualDeadlines:
    """Per request: anchor chunks queued, residual bytes queued, when its last anchor chunk left.

    Args:
        window_s: the draft window of a request whose decode server named none
            (``set_window``); None turns deadlines off (strict anchor priority).
        fifo_bytes_per_s: ``finish`` on a paced link: its rate, at which a
            FIFO clock counts each queued chunk; a residual is then due at its
            request's FIFO finish plus half its window, not one window after
            its anchor left. None (``deadline``, or an unpaced link): no clock.
    """

    def __init__(self, window_s: float | None, *, fifo_bytes_per_s: float | None = None) -> None:
        if window_s is not None and not window_s >= 0:
            raise ValueError(f"window_s must be >= 0 or None, got {window_s!r}")
        self.window_s, self.fifo_bytes_per_s = window_s, fifo_bytes_per_s
        self._rooms: OrderedDict[int, _Room] = OrderedDict()  # oldest first; idle ones kept a while
        self._fifo_end = 0.0  # finish: when a FIFO sender would have sent every byte queued so far

    def set_window(self, room: int, window_s: float) -> None:
        """The draft window the decode server gave for `room`'s request."""
        if not window_s >= 0:
            raise ValueError(f"window_s must be >= 0, got {window_s!r}")
        self._room(room).window_s = window_s

    def queued(self, priority: int, room: int, nbytes: int, now: float | None = None) -> None:
        """A chunk of `nbytes` was queued at `now` (None: not timed, the FIFO clock does not count it)."""
        entry = self._room(room)
        if priority == ANCHOR_CLASS:
            entry.anchor_chunks += 1
        else:
            entry.residual_bytes += nbytes
        if self.fifo_bytes_per_s and now is not None:
            self._fifo_end = max(now, self._fifo_end) + nbytes / self.fifo_bytes_per_s
            entry.fifo_finish = self._fifo_end

    def left(self, priority: int, room: int, nbytes: int, now: float | None) -> None:
        """A chunk left the queue: sent at `now`, or dropped (`now` None)."""
        entry = self._rooms.get(room)
        if entry is None:
            return
        if priority == ANCHOR_CLASS:
            entry.anchor_chunks -= 1
            if now is not None:
                entry.anchor_left_at = now
        else:
            entry.residual_bytes -= nbytes
        if now is None and entry.fifo_finish is not None:
            self._unqueue(entry.fifo_finish, nbytes / self.fifo_bytes_per_s)
        while len(self._rooms) > REMEMBERED_ROOMS and next(iter(self._rooms.values())).idle:
            self._rooms.popitem(last=False)

    def _unqueue(self, after: float, seconds: float) -> None:
        """finish: a dropped chunk's bytes will never be sent, so the FIFO finish of every request
        that finishes after the dropped one's comes `seconds` sooner (an abort does not loosen the
        deadlines of the requests queued behind it)."""
        for entry in self._rooms.values():
            if entry.fifo_finish is not None and entry.fifo_finish > after:
                entry.fifo_finish -= seconds
        self._fifo_end -= seconds

    def backlogs(self) -> list[Backlog]:
        """Every request with residual bytes queued, oldest first, with its deadline."""
        return [
            Backlog(room, entry.residual_bytes, self._deadline(entry))
            for room, entry in self._rooms.items()
            if entry.residual_bytes > 0
        ]

    def due(self, anchor_bytes: int, now: float, bytes_per_s: float | None) -> bool:
        """Whether a residual must go before an anchor chunk of `anchor_bytes` (see `residual_due`)."""
        if self.window_s is None:
            return False
        return residual_due(self.backlogs(), anchor_bytes, now, bytes_per_s)

    def _deadline(self, entry: _Room) -> float | None:
        if entry.anchor_chunks > 0 or entry.anchor_left_at is None:
            return None
        if entry.fifo_finish is not None:
            return entry.fifo_finish + FINISH_SLACK_SHARE * entry.window_s
        return entry.anchor_left_at + entry.window_s

    def _room(self, room: int) -> _Room:
        entry = self._rooms.get(room)
        if entry is None:
            entry = self._rooms[room] = _Room(self.window_s or 0.0)
        elif entry.idle:
            self._rooms.move_to_end(room)  # queued again: its residual leaves after those queued now
        return entry
