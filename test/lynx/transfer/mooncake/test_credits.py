"""The Mooncake listener's credit policy, without sockets or a clock."""

from lynx.transfer.mooncake.control import Session
from lynx.transfer.mooncake.credits import Credits, PeerState

SESSION = Session(b"k", b"s" * 16, b"l" * 16)


def every_slot_in_one_place(credits, slots, held=()):
    granted = [slot for peer_id in (b"a", b"b", b"c") if credits.peer(peer_id)
               for slot in credits.peer(peer_id).granted]
    return credits.free + len(granted) + len(held) == slots and len(set(granted) | set(held)) == len(granted) + len(held)


def test_slots_are_shared_fewest_held_first_and_never_granted_twice():
    credits = Credits(slots=5, per_peer=4, max_peers=8, quarantine_s=10)
    assert credits.admit(b"a", SESSION)
    assert credits.distribute() == {b"a": [0, 1, 2, 3]}
    assert credits.admit(b"b", SESSION)
    assert credits.distribute() == {b"b": [4]}
    assert credits.distribute() == {}
    assert credits.take(b"a", 0)
    credits.release(0)
    assert credits.distribute() == {b"b": [0]}, "the sender holding fewer slots is served first"
    assert every_slot_in_one_place(credits, 5)


def test_only_a_slot_granted_to_the_sender_can_be_taken_and_only_once():
    credits = Credits(slots=2, per_peer=1, max_peers=8, quarantine_s=10)
    credits.admit(b"a", SESSION)
    credits.admit(b"b", SESSION)
    grants = credits.distribute()
    assert not credits.take(b"a", grants[b"b"][0]), "took another sender's slot"
    assert not credits.take(b"c", grants[b"a"][0]), "an unknown sender took a slot"
    assert credits.take(b"a", grants[b"a"][0])
    assert not credits.take(b"a", grants[b"a"][0]), "took the same slot twice"
    assert credits.distribute() == {}, "a slot the caller holds was granted again"
    assert every_slot_in_one_place(credits, 2, held=[grants[b"a"][0]])


def test_an_ended_sender_keeps_its_slots_until_its_quarantine_is_over():
    credits = Credits(slots=2, per_peer=2, max_peers=8, quarantine_s=10)
    credits.admit(b"a", SESSION)
    credits.distribute()
    credits.end(b"a", PeerState.GONE, now=100.0)
    credits.admit(b"b", SESSION)
    assert credits.distribute() == {}
    assert credits.take(b"a", 0), "a notification sent before the sender left no longer counts"
    credits.release(0)
    assert credits.distribute() == {b"b": [0]}
    credits.expire(now=109.9)
    assert credits.peer(b"a") is not None and credits.distribute() == {}
    assert credits.next_end() == 110.0
    credits.expire(now=110.0)
    assert credits.peer(b"a") is None
    assert credits.distribute() == {b"b": [1]}


def test_a_banned_sender_takes_nothing_and_its_quarantine_is_not_extended():
    credits = Credits(slots=1, per_peer=1, max_peers=8, quarantine_s=10)
    credits.admit(b"a", SESSION)
    credits.distribute()
    credits.end(b"a", PeerState.GONE, now=0.0)
    credits.end(b"a", PeerState.BANNED, now=5.0)
    assert not credits.take(b"a", 0)
    assert credits.next_end() == 10.0
    credits.end(b"a", PeerState.ACTIVE, now=6.0)
    assert credits.peer(b"a").state is PeerState.BANNED


def test_admission_is_bounded_and_unique():
    credits = Credits(slots=1, per_peer=1, max_peers=2, quarantine_s=10)
    assert credits.admit(b"a", SESSION) and credits.admit(b"b", SESSION)
    assert not credits.admit(b"c", SESSION)
    assert not credits.admit(b"a", SESSION)


def test_idle_senders_slots_go_to_a_new_sender_and_come_back_when_they_want_again():
    credits = Credits(slots=16, per_peer=8, max_peers=8, quarantine_s=10)
    for peer_id in (b"a", b"b"):
        credits.admit(peer_id, SESSION)
    grants = credits.distribute()
    credits.admit(b"c", SESSION)
    assert credits.distribute() == {}, "every slot is held by the first two"
    assert not credits.give_back(b"a", (grants[b"b"][0],)), "gave back another sender's slot"
    assert credits.give_back(b"a", tuple(grants[b"a"]))
    assert len(credits.distribute()[b"c"]) == 8 and credits.distribute() == {}, "an idle sender is granted nothing"
    assert credits.give_back(b"c", tuple(credits.peer(b"c").granted))
    credits.want(b"a")
    assert len(credits.distribute()[b"a"]) == 8
    assert every_slot_in_one_place(credits, 16)


def test_a_sender_gives_its_slots_back_once_idle_long_enough_and_asks_again_when_messages_wait():
    from lynx.transfer.mooncake.control import Grant
    from lynx.transfer.mooncake.credits import SenderCredits

    sender = SenderCredits(arena_slots=16, release_after_s=0.5)
    assert sender.accept(Grant(0, (3, 4))) is None
    assert "out of order" in sender.accept(Grant(0, (5,)))
    assert "outside the arena or granted twice" in sender.accept(Grant(1, (4,)))
    assert "outside the arena or granted twice" in sender.accept(Grant(1, (16,)))
    assert sender.to_release(busy=True, now=10.0) == ()
    assert sender.to_release(busy=False, now=10.1) == () and sender.release_due() == 10.6
    assert sender.to_release(busy=False, now=10.5) == ()
    assert sender.to_release(busy=False, now=10.6) == (3, 4) and not sender.slots
    assert not sender.to_want(waiting=False)
    assert sender.to_want(waiting=True) and not sender.to_want(waiting=True), "asks once"
    assert sender.accept(Grant(1, (7,))) is None and list(sender.slots) == [7]
