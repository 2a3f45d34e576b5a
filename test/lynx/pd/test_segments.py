"""A prefill side and a decode side wired through a recording transport: KV sent per segment
while the prefill is still computing lands exactly what one whole transfer lands."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from pd_fakes import AUX_LENS, LAYERS, SECRET, SHARD, DecodeHost, FakePool, PrefillHost, config, wait_for

from lynx.manifest import wire_version
from lynx.transfer.frames import AUX_STREAM, HEADER_STRUCT
from lynx.transfer.rooms import RoomState
from lynx.transfer.transport import Transport
from lynx.pd.control import DecodeRegistration, RoomMetadata
from lynx.pd.decode_side import DecodeSide
from lynx.pd.prefill_side import PrefillSide

ROOM, TOKENS = 77, 150
SRC, DST = np.arange(0, TOKENS), np.arange(200, 200 + TOKENS)


class Recorder(Transport):
    def __init__(self):
        self.sent = []

    def send(self, endpoint, parts):
        self.sent.append([bytes(p) for p in parts])

    def close(self):
        pass


class Pair:
    """A prefill side whose messages are handed to a decode side on `deliver()`."""

    def __init__(self, segment_tokens: int, **options):
        self.config = config(**{"mode": "lynx", "segment_tokens": segment_tokens, **options})
        self.source, self.target = FakePool(seed=0, slots=400), FakePool(seed=1, slots=400)
        self.decode_host, self.prefill_host = DecodeHost(), PrefillHost()
        self.decode = DecodeSide(self.config, SECRET, self.decode_host, "127.0.0.1")
        self.decode.attach(self.target.view)
        self.prefill = PrefillSide(self.config, SECRET, self.prefill_host, "127.0.0.1")
        self.prefill.transport.close()
        self.prefill.transport = self.prefill.sender._transport = Recorder()
        self.prefill.attach(self.source.view)
        assert self.decode.claim(ROOM)
        nonce = self.decode.reserve(ROOM, DST, 1, 0.0, "prefill")
        registration = DecodeRegistration("127.0.0.1", 5000, "s", 0, 1, AUX_LENS, wire_version(), 1, SHARD)
        self.prefill.on_registration(registration, AUX_LENS)
        endpoint = self.decode.data_endpoint
        self.prefill.on_metadata(RoomMetadata(ROOM, "127.0.0.1", 5000, "s", 1, False, 0, TOKENS, nonce, endpoint))
        assert self.prefill.claim(ROOM)
        self.prefill.start()

    def chunk(self, start: int, end: int, last: bool) -> None:
        self.prefill.add_chunk(ROOM, SRC[start:end], last, 2, end - start)
        assert self.prefill.drain(30) and self.prefill.sender.wait_idle(30)

    def deliver(self, gaps: bool = True) -> None:
        """Hand over what was sent, then (`gaps`) let the data thread apply what landed."""
        sent, self.prefill.transport.sent[:] = list(self.prefill.transport.sent), []
        for parts in sent:
            self.decode._on_message(parts)
        if gaps:
            self.gaps()

    def gaps(self) -> int:
        """What the data thread does between messages: apply landed residuals, a layer a step.
        Returns the number of steps."""
        steps = 0
        while self.decode.receiver.gap():
            steps += 1
        return steps

    def close(self) -> None:
        self.prefill.close()
        self.decode.close()


def _stream_and_segment(parts) -> tuple[int, int] | None:
    """A frame's (stream, segment), read from its header; None for other messages."""
    if len(parts) != 2 or parts[0][:4] != b"LYNX":
        return None
    fields = HEADER_STRUCT.unpack(parts[0][: HEADER_STRUCT.size])
    return fields[3], fields[-1]


def whole_transfer(streams_used: int) -> list[torch.Tensor]:
    """The destination slots after one whole (unsegmented) transfer of the same KV."""
    source, target = FakePool(seed=0, slots=400), FakePool(seed=1, slots=400)
    wire = config(mode="lynx").wire
    streams = wire.encode(source.k, source.v, torch.from_numpy(SRC))
    wire.write(streams[:streams_used], source.view.shape(TOKENS), target.k, target.v, torch.from_numpy(DST))
    return target.snapshot(DST)


@pytest.fixture
def pair():
    made = Pair(segment_tokens=64)
    yield made
    made.close()


def _split(slots: list[torch.Tensor], upgraded: torch.Tensor, first_layers: int = 0, more=None) -> bool:
    """Whether `slots` hold the full reconstruction where `upgraded` (and, in the first
    `first_layers` layers, where `more` too), the anchor-only one elsewhere."""
    masks = [upgraded | more if i % LAYERS < first_layers else upgraded for i in range(2 * LAYERS)]
    return all(
        torch.equal(now[mask], full[mask]) and torch.equal(now[~mask], anchor[~mask])
        for now, anchor, full, mask in zip(slots, whole_transfer(1), whole_transfer(2), masks, strict=True)
    )


def _tokens(first: int, count: int) -> torch.Tensor:
    mask = torch.zeros(TOKENS, dtype=torch.bool)
    mask[first : first + count] = True
    return mask


def test_each_segment_is_written_as_soon_as_its_anchor_lands_and_decoding_waits_for_the_last(pair):
    before = pair.target.snapshot(DST)
    pair.chunk(0, 100, last=False)  # completes segment 0 (tokens 0..67): its anchor travels now
    pair.deliver()
    after = pair.target.snapshot(DST)
    changed = [int((a != b).any(dim=(1, 2)).nonzero().max()) + 1 for a, b in zip(after, before)]
    assert max(changed) == 68, "only segment 0's slots may hold KV yet"
    assert pair.decode_host.succeeded == [] and pair.decode.room_state(ROOM) is RoomState.RECEIVING
    pair.chunk(100, TOKENS, last=True)
    pair.deliver(gaps=False)
    assert pair.decode_host.succeeded == [ROOM] and pair.prefill_host.succeeded == [ROOM]
    # Segment 0's residual landed while the prefill computed: upgraded before decoding began.
    assert _split(pair.target.snapshot(DST), _tokens(0, 68))
    assert pair.decode.room_state(ROOM) is RoomState.LANDED
    assert pair.decode.apply_residual(ROOM)
    assert all(torch.equal(a, b) for a, b in zip(pair.target.snapshot(DST), whole_transfer(2)))


def test_a_residual_that_lands_before_its_anchor_is_whole_is_applied_after_the_anchor_write(pair):
    pair.chunk(0, 100, last=False)
    sent, pair.prefill.transport.sent[:] = list(pair.prefill.transport.sent), []
    anchor = [m for m in sent if _stream_and_segment(m) == (0, 0)]
    for parts in [m for m in sent if m not in anchor[-1:]]:  # the anchor's last frame last
        pair.decode._on_message(parts)
    assert pair.gaps() == LAYERS, "segment 1 only: segment 0's anchor is not written yet"
    pair.decode._on_message(anchor[-1])
    assert pair.gaps() == LAYERS, "segment 0 in the next gaps, a layer at a time"
    segment0 = _tokens(0, 68)
    for now, full in zip(pair.target.snapshot(DST), whole_transfer(2)):
        assert torch.equal(now[segment0], full[segment0])
    assert pair.decode.room_state(ROOM) is RoomState.RECEIVING


def test_messages_go_before_upgrades_and_an_upgrade_yields_between_layers(pair):
    pair.chunk(0, 100, last=False)
    pair.deliver()
    pair.chunk(100, TOKENS, last=True)
    sent, pair.prefill.transport.sent[:] = list(pair.prefill.transport.sent), []
    aux = [m for m in sent if _stream_and_segment(m) == (AUX_STREAM, 0)]
    for parts in [m for m in sent if m not in aux]:  # a streamed forward's order: its residual, then the metadata
        pair.decode._on_message(parts)
    assert pair.decode.receiver.gap()  # one layer of the last segment in the gap before the metadata
    assert pair.decode_host.succeeded == []
    for parts in aux:
        pair.decode._on_message(parts)
    assert pair.decode_host.succeeded == [ROOM], "the metadata waited for one layer, not for the upgrades"
    assert pair.decode.room_state(ROOM) is RoomState.LANDED
    last = _tokens(*pair.config.wire.segments(TOKENS, 64)[2])
    assert _split(pair.target.snapshot(DST), _tokens(0, 68), first_layers=1, more=last)
    assert pair.decode.apply_residual(ROOM), "the scheduler applies the rest once all has landed"
    assert pair.decode.room_state(ROOM) is RoomState.COMPLETE
    assert all(torch.equal(a, b) for a, b in zip(pair.target.snapshot(DST), whole_transfer(2)))
    pair.gaps()  # the data thread finds nothing left
    assert all(torch.equal(a, b) for a, b in zip(pair.target.snapshot(DST), whole_transfer(2)))


def test_residual_segments_are_applied_one_by_one_as_they_land(pair):
    pair.chunk(0, TOKENS, last=True)
    sent = list(pair.prefill.transport.sent)
    held = [m for m in sent if _stream_and_segment(m) in ((1, 0), (1, 2))]  # residuals but segment 1's
    for parts in sent:
        if parts not in held:
            pair.decode._on_message(parts)
    assert pair.decode.room_state(ROOM) is RoomState.ANCHORED
    pair.gaps()
    assert not pair.decode.apply_residual(ROOM)
    assert _split(pair.target.snapshot(DST), _tokens(*pair.config.wire.segments(TOKENS, 64)[1]))
    for parts in held:
        pair.decode._on_message(parts)
    assert pair.decode.apply_residual(ROOM)
    assert all(torch.equal(a, b) for a, b in zip(pair.target.snapshot(DST), whole_transfer(2)))


def test_more_tokens_than_reserved_fail_the_room_on_both_sides(pair):
    pair.prefill.add_chunk(ROOM, np.arange(0, TOKENS + 1), True, 2, TOKENS + 1)
    (room, reason), = pair.prefill_host.failures
    assert room == ROOM and "reserved 150 tokens, this prefill has 151" in reason


def test_while_the_prefill_computes_its_decode_ranks_hear_it_is_alive_until_the_metadata(monkeypatch):
    from lynx.transfer.alive import ALIVE_TAG
    from lynx.pd import prefill_side

    monkeypatch.setattr(prefill_side, "ALIVE_EVERY_S", 0.05)
    pair = Pair(segment_tokens=64)
    try:
        pair.chunk(0, 100, last=False)
        sent = pair.prefill.transport.sent
        assert wait_for(lambda: sum(m[0] == ALIVE_TAG for m in sent) >= 2), "segment 0 is out, the rest computing"
        pair.chunk(100, TOKENS, last=True)
        pair.deliver()
        assert pair.decode_host.succeeded == [ROOM]
        assert not wait_for(lambda: any(m[0] == ALIVE_TAG for m in sent), timeout_s=0.3), "no alive after the metadata"
    finally:
        pair.close()


@pytest.mark.parametrize(("link_gbps", "sent_as"), [(0.0, "lynx"), (10.0, "int8")])
def test_auto_mode_sends_one_stream_only_where_the_link_keeps_up_and_both_land_the_same_kv(link_gbps, sent_as):
    pair = Pair(segment_tokens=64, mode="auto", link_gbps=link_gbps)
    try:
        pair.prefill.encoder._wires.rate.tokens_per_s = 100.0  # this prefill takes 1.5 s for the request
        pair.chunk(0, TOKENS, last=True)
        pair.deliver()
        # unpaced, the link's rate is unknown: progressive; 10 Gbit/s sends it well within the prefill: one stream
        assert pair.decode.sent_as(ROOM) == sent_as
        assert pair.decode.num_streams(ROOM) == (2 if sent_as == "lynx" else 1)
        assert pair.decode_host.succeeded == [ROOM]
        if sent_as == "lynx":
            assert pair.decode.apply_residual(ROOM)
        assert pair.decode.room_state(ROOM) is RoomState.COMPLETE
        assert all(torch.equal(a, b) for a, b in zip(pair.target.snapshot(DST), whole_transfer(2)))
    finally:
        pair.close()
