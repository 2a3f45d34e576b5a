"""Who may write which slot of a Mooncake listener's arena: senders, their states, and credits (pure).

A slot is in exactly one place: free, granted to one sender (it may write it
and then notify it), or held by the listener's caller. Slots granted to a
sender that ended (gone or banned) stay its own until ``quarantine_s`` after
it ended, since a late write of it may still land there; then they are free.
No sockets, no clock: callers pass ``now``.
"""

from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass, field

from lynx.transfer.mooncake_control import Session


class PeerState(enum.Enum):
    """An authenticated sender's standing: ACTIVE -> GONE | BANNED; GONE -> BANNED; both end later."""

    ACTIVE = "active"  # connected: gets grants, may notify
    GONE = "gone"  # its connection closed: notifications it sent before still count
    BANNED = "banned"  # broke the protocol: nothing it sends counts


@dataclass
class Peer:
    """One authenticated sender: its session MACs, sequence numbers and the slots granted to it."""

    session: Session
    granted: set[int] = field(default_factory=set)
    next_notify: int = 0
    next_grant: int = 0
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
        """Grant free slots to active senders below ``per_peer``, one at a time, fewest held first."""
        grants: dict[bytes, list[int]] = {}
        hungry = sorted((peer_id for peer_id in self.active() if len(self._peers[peer_id].granted) < self.per_peer),
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
