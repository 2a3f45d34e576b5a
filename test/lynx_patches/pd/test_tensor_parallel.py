"""Prefill ranks and decode ranks of two tensor-parallel servers, wired as SGLang pairs them, through
a recording transport: each decode rank lands exactly its own heads of what one TP 1 transfer lands.

The model has SmolLM2's 3 KV heads, which SGLang pads to 4 at TP 2 (2 per rank;
rank 1 holds head 2 and a zero head). Every shape of TP 1 and TP 2 on either
side is run for every mode.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from pd_fakes import AUX_LENS, DIM, LAYERS, SECRET, DecodeHost, FakePool, PrefillHost, Recorder, config

from lynx.heads import HeadShard, transfer_room
from lynx.manifest import wire_version
from lynx.transfer.frames import AUX_STREAM, HEADER_STRUCT
from lynx.transfer.rooms import RoomState
from lynx.pd.control import ControlError, DecodeRegistration, RoomMetadata
from lynx.pd.decode_side import DecodeSide
from lynx.pd.prefill_side import PrefillSide

ROOM, TOKENS, SLOTS, REAL_HEADS = 77, 150, 400, 3
SRC, DST = np.arange(0, TOKENS), np.arange(200, 200 + TOKENS)
SHAPES = [(1, 1), (2, 2), (1, 2), (2, 1)]  # (prefill TP, decode TP)


def shard(tp: int, rank: int) -> HeadShard:
    return HeadShard(tp, rank, -(-REAL_HEADS // tp), REAL_HEADS)  # heads padded up to a multiple of tp


def model_kv() -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """The model's KV of every slot in the padded head space (4 heads, the last one zero)."""
    g = torch.Generator().manual_seed(0)
    k = [torch.randn(SLOTS, 4, DIM, generator=g).to(torch.bfloat16) for _ in range(LAYERS)]
    v = [torch.randn(SLOTS, 4, DIM, generator=g).to(torch.bfloat16) for _ in range(LAYERS)]
    for t in k + v:
        t[:, REAL_HEADS:] = 0
    return k, v


def rank_pool(rank_shard: HeadShard, seed: int, kv=None) -> FakePool:
    """A rank's pool: random (a decode rank's, before the transfer), or its heads of `kv`."""
    pool = FakePool(seed=seed, slots=SLOTS, shard=rank_shard)
    if kv is not None:
        first, end = rank_shard.first, rank_shard.end
        for mine, model in zip(pool.k + pool.v, kv[0] + kv[1]):
            mine.copy_(model[:, first:end])
    return pool


def tp1_result(mode: str, streams_used: int) -> list[torch.Tensor]:
    """Per layer K then V of the destination slots after a TP 1 transfer (heads 0..2)."""
    k, v = model_kv()
    wire = config(mode=mode).wire
    target = FakePool(seed=9, slots=SLOTS, shard=shard(1, 0))
    streams = wire.encode([t[:, :REAL_HEADS] for t in k], [t[:, :REAL_HEADS] for t in v], torch.from_numpy(SRC))
    wire.write(streams[:streams_used], target.view.shape(TOKENS), target.k, target.v, torch.from_numpy(DST))
    return target.snapshot(DST)


class Servers:
    """`prefill_tp` prefill ranks and `decode_tp` decode ranks, each decode rank reserved, registered and
    announced to its sources the way SGLang's rank mapping pairs them."""

    def __init__(self, mode: str, prefill_tp: int, decode_tp: int) -> None:
        self.config = config(mode=mode)
        kv = model_kv()
        self.decode_pools = [rank_pool(shard(decode_tp, d), seed=10 + d) for d in range(decode_tp)]
        self.before = [pool.snapshot(DST) for pool in self.decode_pools]
        self.decode_hosts = [DecodeHost() for _ in range(decode_tp)]
        self.decodes = [DecodeSide(self.config, SECRET, h, "127.0.0.1") for h in self.decode_hosts]
        self.prefill_hosts = [PrefillHost() for _ in range(prefill_tp)]
        self.prefills = [PrefillSide(self.config, SECRET, h, "127.0.0.1") for h in self.prefill_hosts]
        for side, pool in zip(self.decodes, self.decode_pools):
            side.attach(pool.view)
        for p, side in enumerate(self.prefills):
            side.transport.close()
            side.transport = side.sender._transport = Recorder()
            side.attach(rank_pool(shard(prefill_tp, p), seed=20 + p, kv=kv).view)
        self.by_endpoint = {side.data_endpoint: side for side in self.decodes}
        for d, side in enumerate(self.decodes):
            if prefill_tp > decode_tp:
                srcs = list(range(d * (prefill_tp // decode_tp), (d + 1) * (prefill_tp // decode_tp)))
            else:
                srcs = [d // (decode_tp // prefill_tp)]
            assert side.claim(ROOM)
            nonce = side.reserve(ROOM, DST, 1, 0.0, "prefill", (), sources=len(srcs))
            heads = side.pool.shard
            registration = DecodeRegistration(
                "127.0.0.1", 5000 + d, f"d{d}", d, decode_tp, AUX_LENS, wire_version(), 1, heads
            )
            wanted = decode_tp // prefill_tp if decode_tp > prefill_tp else 1
            meta = RoomMetadata(ROOM, "127.0.0.1", 5000 + d, f"d{d}", wanted, False, 0, TOKENS, nonce, side.data_endpoint)
            for p in srcs:
                self.prefills[p].on_registration(registration, AUX_LENS)
                self.prefills[p].on_metadata(meta)
        for side in self.prefills:
            assert side.claim(ROOM)
            side.start()

    def prefill_all(self) -> None:
        for side in self.prefills:
            side.add_chunk(ROOM, SRC, True, 2, TOKENS)
            assert side.drain(30) and side.sender.wait_idle(30)

    def deliver(self, prefill_ranks=None) -> None:
        for p, side in enumerate(self.prefills):
            if prefill_ranks is not None and p not in prefill_ranks:
                continue
            sent, side.transport.sent[:] = list(side.transport.sent), []
            for endpoint, parts in sent:
                self.by_endpoint[endpoint]._on_message(parts)

    def close(self) -> None:
        for side in self.prefills + self.decodes:
            side.close()


@pytest.fixture
def servers(request):
    made = Servers(*request.param)
    yield made
    made.close()


def _frame_stream(parts) -> int | None:
    if len(parts) != 2 or parts[0][:4] != b"LYNX":
        return None
    return HEADER_STRUCT.unpack(parts[0][: HEADER_STRUCT.size])[3]


def assert_each_rank_holds_its_heads_of(servers, expected) -> None:
    """Every decode rank's real heads hold `expected` (a TP 1 transfer's). Its padding heads hold the
    prefill rank's (zero) when both servers shard alike (whole ranks are exchanged), else what they held."""
    alike = servers.prefills[0].pool.shard.same_layout(servers.decodes[0].pool.shard)
    for pool, before in zip(servers.decode_pools, servers.before):
        rank = pool.shard
        real = min(rank.end, REAL_HEADS) - rank.first
        for now, old, want in zip(pool.snapshot(DST), before, expected):
            assert torch.equal(now[:, :real], want[:, rank.first : rank.first + real])
            padding = torch.zeros_like(old[:, real:]) if alike else old[:, real:]
            assert torch.equal(now[:, real:], padding), "padding heads: the sender's, or never written"


@pytest.mark.parametrize("servers", [("lynx", p, d) for p, d in SHAPES], indirect=True, ids=str)
def test_each_decode_rank_lands_its_heads_anchor_first_then_the_residual(servers):
    servers.prefill_all()
    servers.deliver()
    assert all(host.succeeded == [ROOM] for host in servers.decode_hosts)
    assert all(side.room_state(ROOM) is RoomState.LANDED for side in servers.decodes)
    assert_each_rank_holds_its_heads_of(servers, tp1_result("lynx", 1))
    assert all(side.apply_residual(ROOM) for side in servers.decodes)
    assert_each_rank_holds_its_heads_of(servers, tp1_result("lynx", 2))


@pytest.mark.parametrize("mode", ["bf16", "int8", "int4"])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_one_stream_modes_land_exactly_each_ranks_heads(mode, shape):
    servers = Servers(mode, *shape)
    try:
        servers.prefill_all()
        servers.deliver()
        assert all(host.succeeded == [ROOM] for host in servers.decode_hosts)
        assert all(side.room_state(ROOM) is RoomState.COMPLETE for side in servers.decodes)
        assert_each_rank_holds_its_heads_of(servers, tp1_result(mode, 1))
    finally:
        servers.close()


@pytest.mark.parametrize("servers", [("lynx", 2, 1)], indirect=True)
def test_a_decode_rank_fed_by_two_prefill_ranks_starts_only_when_both_anchors_are_in(servers):
    servers.prefill_all()
    servers.deliver(prefill_ranks={0})
    (decode,) = servers.decodes
    assert decode.parts(ROOM) == (ROOM, transfer_room(ROOM, 1))
    assert [decode._rooms.state(wire) for wire in decode.parts(ROOM)] == [RoomState.LANDED, RoomState.RESERVED]
    assert servers.decode_hosts[0].succeeded == [] and decode.room_state(ROOM) is RoomState.RESERVED
    servers.deliver(prefill_ranks={1})
    assert servers.decode_hosts[0].succeeded == [ROOM]


@pytest.mark.parametrize("servers", [("lynx", 2, 1)], indirect=True)
def test_a_release_right_after_the_last_part_is_anchored_is_never_followed_by_success(servers, monkeypatch):
    """As with one part (test_decode_side): the consumer releases the request the moment its last
    part's anchor is in; success is reported before the release returns, or not at all."""
    servers.prefill_all()
    servers.deliver(prefill_ranks={0})
    (decode,), (host,) = servers.decodes, servers.decode_hosts
    last = transfer_room(ROOM, 1)
    table = type(decode._rooms)
    anchored = table.anchored

    def anchored_then_released(self, room):
        result = anchored(self, room)
        if result and room == last and decode.room_state(ROOM) is not None:
            decode.release(ROOM)
            host.succeeded.append("released")
        return result

    monkeypatch.setattr(table, "anchored", anchored_then_released)
    servers.deliver(prefill_ranks={1})
    assert decode.room_state(ROOM) is None and "released" in host.succeeded
    assert host.succeeded[-1] == "released", f"success reported after the release: {host.succeeded}"


@pytest.mark.parametrize("servers", [("lynx", 2, 1)], indirect=True)
def test_a_failure_of_one_source_fails_the_whole_request(servers):
    servers.prefill_all()
    servers.deliver(prefill_ranks={0})
    (decode,) = servers.decodes
    decode.on_prefill_failure(ROOM, "prefill rank 1 ran out of memory")
    assert decode.room_state(ROOM) is RoomState.FAILED
    assert decode.check(ROOM) is not None
    assert all(decode._rooms.state(wire) is RoomState.FAILED for wire in decode.parts(ROOM))
    assert servers.decode_hosts[0].failures == [(ROOM, "prefill rank 1 ran out of memory")]
    decode.release(ROOM)
    assert decode.live_count() == 0 and decode.room_state(ROOM) is None


@pytest.mark.parametrize("servers", [("lynx", 1, 2)], indirect=True)
def test_one_prefill_rank_sends_every_anchor_of_both_decode_ranks_before_any_residual(servers):
    servers.prefill_all()
    (prefill,) = servers.prefills
    streams = [_frame_stream(parts) for _, parts in prefill.transport.sent]
    anchors = [i for i, s in enumerate(streams) if s in (0, AUX_STREAM)]
    residuals = [i for i, s in enumerate(streams) if s is not None and s not in (0, AUX_STREAM)]
    assert {endpoint for endpoint, _ in prefill.transport.sent} == set(servers.by_endpoint)
    assert anchors and residuals and max(anchors) < min(residuals)


def test_a_decode_rank_whose_heads_cannot_be_resliced_is_refused_with_the_reason():
    side = PrefillSide(config(mode="lynx"), SECRET, PrefillHost(), "127.0.0.1")
    try:
        side.attach(rank_pool(HeadShard(1, 0, 2, 2), seed=1).view)
        replicated = HeadShard(4, 1, 1, 2, replicated=True)
        registration = DecodeRegistration("127.0.0.1", 5000, "d1", 1, 4, AUX_LENS, wire_version(), 1, replicated)
        with pytest.raises(ControlError, match="replicated over ranks"):
            side.on_registration(registration, AUX_LENS)
        assert "cannot get its KV heads here" in side.refused["d1"]
    finally:
        side.close()


def test_heads_that_no_source_announces_fail_the_request():
    side = DecodeSide(config(mode="lynx"), SECRET, DecodeHost(), "127.0.0.1")
    try:
        side.attach(rank_pool(shard(1, 0), seed=1).view)
        assert side.claim(ROOM)
        side.reserve(ROOM, DST, 1, 0.0, "prefill", (), sources=2)
        from lynx.manifest import Manifest, dtype_name
        from lynx.transfer.keys import transfer_key

        key = transfer_key(SECRET, side.reservation(ROOM).nonce)
        wire = side.config.wire
        for part, first in ((0, 0), (1, 0)):  # both sources announce heads [0, 2): head 2 is missing
            shape = side.pool.shape(TOKENS, 2)
            sizes = wire.stream_sizes(shape)
            manifest = Manifest(
                transfer_room(ROOM, part), "lynx", side.config.preset, LAYERS, TOKENS, 2, DIM,
                dtype_name(torch.bfloat16), sizes, side.pool.aux_size, 0, first,
            )  # fmt: skip
            side._on_message(manifest.seal(key))
        assert side.room_state(ROOM) is RoomState.FAILED
        assert "overlapping KV heads" in side._host.failures[0][1]
    finally:
        side.close()


@pytest.mark.parametrize("servers", [("lynx", 2, 1)], indirect=True)
def test_a_second_manifest_for_a_part_moves_none_of_its_kv_even_signed_with_the_requests_key(servers):
    """Every part of a request is keyed alike, so another source could sign a manifest for this
    part's id: once the part has its manifest, a later one (here placing its heads one further)
    is dropped and changes nothing."""
    from dataclasses import replace

    from lynx.manifest import manifest_room, open_manifest

    servers.prefill_all()
    (decode,) = servers.decodes
    key = decode._rooms.get(ROOM).key
    sent, servers.prefills[0].transport.sent[:] = list(servers.prefills[0].transport.sent), []
    first = next(parts for _, parts in sent if manifest_room(parts) == ROOM)
    moved = replace(open_manifest(first, key), first_head=1)
    decode._on_message(first)
    decode._on_message(moved.seal(key))
    for _, parts in sent:
        if parts is not first:
            decode._on_message(parts)
    servers.deliver(prefill_ranks={1})
    assert servers.decode_hosts[0].succeeded == [ROOM] and decode.dropped == 1
    assert_each_rank_holds_its_heads_of(servers, tp1_result("lynx", 1))
    assert decode.apply_residual(ROOM)
    assert_each_rank_holds_its_heads_of(servers, tp1_result("lynx", 2))
