"""`RoomWires`: the mode's wire format, or under auto mode one chosen per room from the link and the prefill's pace."""

from types import SimpleNamespace

from pd_fakes import FakePool, config

from lynx.pd.room_wires import RoomWires


class Link:
    """What the choice reads of the sender: its backlog and its paced rate (None: unpaced)."""

    def __init__(self, bytes_per_s, queued_bytes=0):
        self.link_bytes_per_s, self.queued_bytes = bytes_per_s, queued_bytes

    def stats(self):
        return SimpleNamespace(queued_bytes=self.queued_bytes)


class Clock:
    now = 10.0

    def __call__(self):
        return self.now


def auto_wires(link, clock=None):
    """Auto mode's `RoomWires`, and the wire format of every room it has not chosen for."""
    cfg = config(mode="auto", segment_tokens=0)
    default = cfg.wire
    return RoomWires(cfg, default, link, clock or Clock()), default


def test_outside_auto_mode_every_room_gets_the_modes_wire_format():
    cfg = config(mode="lynx")
    mode_wire = cfg.wire
    wires = RoomWires(cfg, mode_wire, Link(1e12))
    wires.choose(9, 20, FakePool().view)
    assert wires.of(9) is mode_wire and wires.rate.seconds(20) is None


def test_before_any_prefill_was_timed_auto_mode_sends_progressive_streams():
    wires, default = auto_wires(Link(1e12))
    wires.choose(9, 20, FakePool().view)
    assert wires.of(9) is not default and wires.of(9).mode == "lynx"


def test_a_link_that_keeps_up_with_the_prefill_gets_one_stream_and_a_backlogged_one_progressive_streams():
    link = Link(1e12)
    wires, _ = auto_wires(link)
    wires.rate.tokens_per_s = 100.0
    wires.choose(9, 20, FakePool().view)
    link.queued_bytes = 10**15
    wires.choose(10, 20, FakePool().view)
    assert (wires.of(9).mode, wires.of(10).mode) == ("int8", "lynx")


def test_a_room_keeps_the_format_chosen_at_its_first_segment_until_it_is_forgotten():
    link = Link(1e12)
    wires, default = auto_wires(link)
    wires.rate.tokens_per_s = 100.0
    wires.choose(9, 20, FakePool().view)
    link.queued_bytes = 10**15
    wires.choose(9, 20, FakePool().view)
    assert wires.of(9).mode == "int8"
    wires.forget(9)
    assert wires.of(9) is default


def test_a_finished_prefill_times_the_pace_from_its_first_segment():
    clock = Clock()
    wires, default = auto_wires(Link(None), clock)
    wires.choose(9, 20, FakePool().view)
    clock.now += 2.0
    wires.finished(9)
    assert wires.rate.tokens_per_s == 10.0 and wires.of(9) is default
