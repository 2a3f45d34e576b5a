"""`Outgoing` on its own: the segments each chunk or forward completes, and the checks that fail a room."""

import numpy as np

from lynx.pd.outgoing import Outgoing


def outgoing(total=10, per_segment=4):
    return Outgoing(total, [(s, min(per_segment, total - s)) for s in range(0, total, per_segment)])


def test_a_segment_is_handed_over_once_whichever_completes_it():
    out = outgoing()
    segments = out.begin_forward(np.arange(100, 106))
    assert [(s.index, s.first_token, s.slots.tolist()) for s in segments] == [(0, 0, [100, 101, 102, 103])]
    segments, problem = out.add_chunk(np.arange(100, 106), is_last=False)
    assert problem is None and segments == []
    segments, problem = out.add_chunk(np.arange(106, 110), is_last=True)
    assert problem is None and [(s.index, s.first_token, s.total) for s in segments] == [(1, 4, 10), (2, 8, 10)]


def test_a_forward_that_computes_nothing_new_or_more_than_reserved_hands_over_nothing():
    out = outgoing()
    out.add_chunk(np.arange(6), is_last=False)
    assert out.begin_forward(np.arange(6)) == [] and out.begin_forward(np.arange(11)) == []
    assert out.queued == 1


def test_chunks_whose_slots_differ_from_those_a_segment_was_streamed_from_are_a_problem():
    out = outgoing()
    out.begin_forward(np.arange(100, 104))
    segments, problem = out.add_chunk(np.arange(200, 204), is_last=False)
    assert segments == [] and "differ from those its segments were sent from" in problem


def test_once_the_chunks_cover_the_streamed_slots_they_are_no_longer_checked():
    out = outgoing()
    out.begin_forward(np.arange(4))
    assert out.add_chunk(np.arange(4), is_last=False)[1] is None and out.streamed is None


def test_more_tokens_than_reserved_or_too_few_at_the_last_chunk_are_a_problem():
    over = outgoing()
    assert over.add_chunk(np.arange(11), is_last=False) == ([], "the decode ranks reserved 10 tokens, this prefill has 11 to send")
    short = outgoing()
    segments, problem = short.add_chunk(np.arange(9), is_last=True)
    assert segments == [] and "reserved 10 tokens, this prefill has 9" in problem
