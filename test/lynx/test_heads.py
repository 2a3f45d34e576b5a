"""Which KV heads a prefill rank sends each decode rank, and where they land (`lynx.heads`)."""

from __future__ import annotations

import pytest

from lynx.heads import HeadShard, HeadSlice, heads_to_send, part_of, placement, sources, transfer_room, uncovered

# SmolLM2: 3 KV heads; at TP 2 SGLang's CPU path pads them to 4, 2 per rank.
TP1 = HeadShard(1, 0, 3, 3)
TP2 = [HeadShard(2, r, 2, 3) for r in range(2)]


def test_ranks_that_shard_alike_exchange_every_head_padding_included():
    assert [heads_to_send(rank, rank) for rank in TP2] == [HeadSlice(0, 2), HeadSlice(2, 2)]
    assert heads_to_send(TP1, TP1) == HeadSlice(0, 3)


def test_a_tp1_prefill_sends_each_tp2_decode_rank_its_real_heads_only():
    assert [heads_to_send(TP1, rank) for rank in TP2] == [HeadSlice(0, 2), HeadSlice(2, 1)]
    assert [placement(rank, *heads_to_send(TP1, rank)) for rank in TP2] == [0, 0]


def test_each_tp2_prefill_rank_sends_a_tp1_decode_rank_its_own_real_heads():
    slices = [heads_to_send(rank, TP1) for rank in TP2]
    assert slices == [HeadSlice(0, 2), HeadSlice(2, 1)]
    assert [placement(TP1, *s) for s in slices] == [0, 2]
    assert uncovered(TP1, slices) == [] and uncovered(TP1, slices[:1]) == [2]


def test_heads_replicated_over_ranks_are_not_resliced_but_equal_tp_exchanges_them():
    replicated = [HeadShard(4, r, 1, 2, replicated=True) for r in range(4)]
    assert heads_to_send(replicated[3], replicated[3]) == HeadSlice(3, 1)
    with pytest.raises(ValueError, match="replicated over ranks"):
        heads_to_send(HeadShard(1, 0, 2, 2), replicated[1])


def test_ranks_without_a_head_in_common_and_other_models_are_refused():
    with pytest.raises(ValueError, match="none in common"):
        heads_to_send(HeadShard(4, 3, 1, 3), TP1)  # rank 3 of 4 holds only the padding head
    with pytest.raises(ValueError, match="KV heads, the decode's"):
        heads_to_send(HeadShard(1, 0, 4, 4), TP2[0])


def test_heads_outside_the_decode_ranks_share_cannot_be_placed():
    with pytest.raises(ValueError, match="this decode rank holds"):
        placement(TP2[1], 1, 2)
    with pytest.raises(ValueError, match="this decode rank holds"):
        placement(TP2[0], 0, 0)


def test_parts_number_the_sources_of_a_decode_rank_and_part_0_keeps_the_room():
    assert sources(2, 1) == 2 and sources(1, 2) == 1 and sources(2, 2) == 1
    assert [part_of(rank, 1) for rank in TP2] == [0, 1]
    assert [part_of(rank, 2) for rank in TP2] == [0, 0]
    assert transfer_room(77, 0) == 77
    assert transfer_room(77, 1) == transfer_room(77, 1) not in (77, transfer_room(78, 1))


def test_a_shard_that_cannot_hold_the_model_is_rejected():
    with pytest.raises(ValueError, match="cannot hold"):
        HeadShard(2, 0, 1, 3)
    with pytest.raises(ValueError, match="tp_rank"):
        HeadShard(2, 2, 2, 3)
