"""Who may write which slot of a Mooncake listener's arena: senders, their states, and credits (pure).

A slot is in exactly one place: free, granted to one sender (it may write it
and then notify it), or held by the listener's caller. Slots granted to a
sender that ended (gone or banned) stay its own until ``quarantine_s`` after
it ended, since a late write of it may still land there; then they are free.
Slots go only to senders that want them: a sender idle for a while gives its
slots back and wants none until it has messages again (`SenderCredits` is
its side of that), so idle senders never starve busy ones.
No sockets, no clock: callers pass ``now``.
"""

from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass, field

from lynx.transfer.mooncake.control import Grant, Session


class PeerState(enum.Enum):
    """An authenticated sender's standing: ACTIVE -> GONE | BANNED; GONE -> BANNED; both end later."""

    ACTIVE = "active"  # connected: gets grants, may notify
    GONE = "gone"  # its connection closed: notifications it sent before still count
    BANNED = "banned"  # broke the protocol: nothing it sends counts


@dataclass
class Peer:
    """One authenticated sender: its session MACs, sequence numbers, the slots granted to it, and
    whether it wants more (it gave its slots back and has not asked again)."""

    session: Session
    granted: set[int] = field(default_factory=set)
    next_seq: int = 0  # of its next notification, release or want
    next_grant: int = 0
    wants: bool = True
    state: PeerState = PeerState.ACTIVE
    ends_at: float = 0.0


class Credits:
    """The arena's slots and the senders they are granted to.

    Args:
        slots: slots in the arena.
        per_peer: slots one sender holds at most.
        max_peers: senders (active or not yet expired) at most.
        quarantine_s: how long an ended sender keeps its slots.
    """

    def __init__(self, slots: int, per_peer: int, max_peers: int, quarantine_s: float) -> None:
        self.per_peer, self.max_peers, self.quarantine_s = min(per_peer, slots), max_peers, quarantine_s
        self._free: deque[int] = deque(range(slots))
        self._peers: dict[bytes, Peer] = {}

    @property
    def free(self) -> int:
        """Slots granted to no one and not held."""
        return len(self._free)

    def peer(self, peer_id: bytes) -> Peer | None:
        return self._peers.get(peer_id)

    def active(self) -> list[bytes]:
        return [peer_id for peer_id, peer in self._peers.items() if peer.state is PeerState.ACTIVE]

    def admit(self, peer_id: bytes, session: Session) -> bool:
        """Add an authenticated sender; False if ``max_peers`` are known already (or this one is)."""
        if peer_id in self._peers or len(self._peers) >= self.max_peers:
            return False
        self._peers[peer_id] = Peer(session)
        return True

    def take(self, peer_id: bytes, slot: int) -> bool:
        """A sender notified ``slot``: it moves to the caller. False if it was not granted to that sender."""
        peer = self._peers.get(peer_id)
        if peer is None or peer.state is PeerState.BANNED or slot not in peer.granted:
            return False
        peer.granted.discard(slot)
        return True

    def release(self, slot: int) -> None:
        """The caller is done with ``slot``."""
        self._free.append(slot)

    def give_back(self, peer_id: bytes, slots: tuple[int, ...]) -> bool:
        """An idle sender returns ``slots`` (all granted to it) and wants none until `want`; False
        (nothing changed) if one of them is not its own."""
        peer = self._peers.get(peer_id)
        if peer is None or peer.state is PeerState.BANNED or not set(slots) <= peer.granted:
            return False
        peer.granted -= set(slots)
        self._free.extend(slots)
        peer.wants = False
        return True

    def want(self, peer_id: bytes) -> None:
        """The sender has messages to write again."""
        peer = self._peers.get(peer_id)
        if peer is not None:
            peer.wants = True

    def end(self, peer_id: bytes, state: PeerState, now: float) -> None:
        """A sender is gone or banned: no more grants; forgotten ``quarantine_s`` after it first ended."""
        peer = self._peers.get(peer_id)
        if peer is None or state is PeerState.ACTIVE or peer.state is PeerState.BANNED:
            return
        if peer.state is PeerState.ACTIVE:
            peer.ends_at = now + self.quarantine_s
        peer.state = state

    def next_end(self) -> float | None:
        """When the next ended sender is forgotten, if any."""
        ends = [peer.ends_at for peer in self._peers.values() if peer.state is not PeerState.ACTIVE]
        return min(ends, default=None)

    def expire(self, now: float) -> None:
        """Forget ended senders whose quarantine is over; their slots become free."""
        for peer_id in [pid for pid, peer in self._peers.items()
                        if peer.state is not PeerState.ACTIVE and peer.ends_at <= now]:
            self._free.extend(sorted(self._peers.pop(peer_id).granted))

    def distribute(self) -> dict[bytes, list[int]]:
        """Grant free slots to active senders that want them, below ``per_peer``, one at a time,
        fewest held first."""
        grants: dict[bytes, list[int]] = {}
        hungry = sorted((peer_id for peer_id in self.active()
                         if self._peers[peer_id].wants and len(self._peers[peer_id].granted) < self.per_peer),
                        key=lambda peer_id: len(self._peers[peer_id].granted))
        while self._free and hungry:
            for peer_id in list(hungry):
                if not self._free:
                    break
                slot = self._free.popleft()
                self._peers[peer_id].granted.add(slot)
                grants.setdefault(peer_id, []).append(slot)
                if len(self._peers[peer_id].granted) >= self.per_peer:
                    hungry.remove(peer_id)
        return grants


class SenderCredits:
    """A sender's side of the credits of one listener: the slots granted to it, in order, and when
    to give them back or ask again (pure: callers pass ``now``).

    Args:
        arena_slots: the listener's slots (a grant naming another is refused).
        release_after_s: with nothing to send for this long, the sender gives its slots back.
    """

    def __init__(self, arena_slots: int, release_after_s: float) -> None:
        self.arena_slots, self.release_after_s = arena_slots, release_after_s
        self.slots: deque[int] = deque()
        self.next_grant = 0
        self.wanting = True  # a new sender is granted slots at once
        self._idle_since: float | None = None

    def accept(self, grant: Grant) -> str | None:
        """Take a grant (its MAC checked by the caller); why it is refused, or None."""
        if grant.seq != self.next_grant:
            return f"grant {grant.seq} out of order (expected {self.next_grant})"
        if any(slot >= self.arena_slots or slot in self.slots for slot in grant.slots):
            return f"slots {grant.slots} outside the arena or granted twice"
        self.slots.extend(grant.slots)
        self.next_grant += 1
        return None

    def to_want(self, waiting: bool) -> bool:
        """Whether to send ``Want`` now: messages wait and the slots were given back."""
        if waiting and not self.wanting:
            self.wanting = True
            return True
        return False

    def to_release(self, busy: bool, now: float) -> tuple[int, ...]:
        """The slots to give back now (``Release``): all of them once nothing was queued or in
        flight for ``release_after_s``; else ()."""
        if busy:
            self._idle_since = None
            return ()
        self._idle_since = now if self._idle_since is None else self._idle_since
        if not self.slots or now - self._idle_since < self.release_after_s:
            return ()
        released = tuple(self.slots)
        self.slots.clear()
        self.wanting = False
        return released

    def release_due(self) -> float | None:
        """When `to_release` gives slots back if nothing is sent meanwhile, or None."""
        if not self.slots or self._idle_since is None:
            return None
        return self._idle_since + self.release_after_s
