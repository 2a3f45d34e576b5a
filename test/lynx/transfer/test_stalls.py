"""The sender's stall timer against a fake clock: when a peer is given up, and why."""

from lynx.transfer.stalls import StallWatch


class Clock:
    now = 0.0

    def __call__(self):
        return self.now


def never_ready(endpoint):
    return False


def test_a_peer_not_ready_for_the_timeout_is_given_up_and_its_stall_forgotten():
    clock = Clock()
    watch = StallWatch(timeout_s=2.0, clock=clock)
    assert watch.check("peer", never_ready) == (False, None)
    clock.now = 1.9
    assert watch.check("peer", never_ready) == (False, None)
    clock.now = 2.0
    ready, give_up = watch.check("peer", never_ready)
    assert not ready and "peer took no data for 2 s" in give_up
    assert watch.check("peer", never_ready) == (False, None), "a given-up peer's next stall starts afresh"


def test_a_peer_ready_again_restarts_its_stall():
    clock = Clock()
    watch = StallWatch(timeout_s=2.0, clock=clock)
    watch.check("peer", never_ready)
    clock.now = 1.5
    assert watch.check("peer", lambda endpoint: True) == (True, None)
    clock.now = 3.0
    assert watch.check("peer", never_ready) == (False, None)


def test_a_peer_whose_check_raises_is_given_up_at_once():
    def broken(endpoint):
        raise OSError("connection reset")

    assert StallWatch(timeout_s=30.0).check("peer", broken) == (False, "OSError: connection reset")
