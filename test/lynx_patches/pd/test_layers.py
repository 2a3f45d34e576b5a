"""Segments a prefill forward completes leave layer by layer while it runs (`lynx.pd.layers`, `lynx_patches.pd.layer_hooks`)."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from lynx.transfer.alive import alive_room
from lynx.transfer.frames import AUX_STREAM, HEADER_BYTES, HEADER_STRUCT
from pd_fakes import AUX_LENS, LAYERS, decode_registration, recording_prefill_side, room_metadata, wait_for

from lynx.pd.layers import ForwardLayers
from lynx_patches.pd.layer_hooks import streams_layers_of

TOKENS = 20
SLOTS = np.arange(10, 10 + TOKENS)


def ready_side(**options):
    """A recording prefill side with room 9 (20 tokens) claimed and ready, its threads started."""
    side = recording_prefill_side(**options)
    side.on_registration(decode_registration(), AUX_LENS)
    side.on_metadata(room_metadata(tokens=TOKENS))
    assert side.claim(9)
    side.start()
    return side


def sent(side) -> list[bytes]:
    """Every message the side sent, but alive messages, each as its bytes joined."""
    return [b"".join(parts) for _, parts in side.transport.sent if alive_room(parts) is None]


def frame_layers(side) -> list[tuple[int, int, int]]:
    """``(stream, layer_start, layer_end)`` of every KV frame sent so far."""
    out = []
    for _, parts in side.transport.sent:
        if len(parts) == 2 and len(parts[0]) == HEADER_BYTES:
            fields = HEADER_STRUCT.unpack(parts[0][: HEADER_STRUCT.size])
            stream, layer_start, layer_end = fields[3], fields[8], fields[9]
            if stream != AUX_STREAM:
                out.append((stream, layer_start, layer_end))
    return out


def whole_send(**options) -> list[bytes]:
    """What the side sends when the room's only chunk is handed over after its forward."""
    side = ready_side(**options)
    try:
        side.add_chunk(9, SLOTS, True, 2, TOKENS)
        assert wait_for(lambda: side.host.succeeded) and side.sender.wait_idle(30)
        return sent(side)
    finally:
        side.close()


def test_the_layer_count_of_a_forward_only_grows_and_ends_complete_or_failed():
    stop = threading.Event()
    layers = ForwardLayers(4)
    layers.written(2)
    assert layers.wait(0, stop) == 2
    layers.written(1)
    assert layers.wait(1, stop) == 2
    layers.finish(True)
    assert layers.wait(2, stop) == 4
    failed = ForwardLayers(4)
    failed.written(1)
    failed.finish(False)
    assert failed.wait(0, stop) == 1 and failed.wait(1, stop) is None


class RecordedMarks:
    """Stands in for `DeviceMarks`: numbered marks, of which the device has reached the first
    `done` (`synchronize` on a later one reaches it); `waited` lists the marks waited for."""

    def __init__(self) -> None:
        self.made, self.done, self.waited = 0, 0, []

    def mark(self):
        self.made += 1
        return self.Mark(self, self.made)

    def everything(self):
        return self.Mark(self, None)

    class Mark:
        def __init__(self, owner, number) -> None:
            self.owner, self.number = owner, number

        def query(self) -> bool:
            return self.number is not None and self.number <= self.owner.done

        def synchronize(self) -> None:
            self.owner.waited.append(self.number or "device drained")
            self.owner.done = max(self.owner.done, self.number or self.owner.made)


def test_on_a_device_the_encoder_takes_the_layers_the_device_has_written_not_all_those_queued():
    stop, marks = threading.Event(), RecordedMarks()
    layers = ForwardLayers(6, marks)
    for count in range(1, 5):
        layers.written(count)  # the host queues four layers at once
    assert layers.wait(0, stop) == 1 and marks.waited == [1], "nothing done yet: wait for the first layer only"
    marks.done = 3
    assert layers.wait(1, stop) == 3 and marks.waited == [1, 2], "take what the device has done"
    layers.finish(True)  # layers 5 and 6 were written where no hook saw them
    assert layers.wait(3, stop) == 4
    assert layers.wait(4, stop) == 6 and marks.waited[-1] == "device drained"


def test_on_a_device_a_forward_whose_hooks_reported_every_layer_ends_at_its_last_mark():
    stop, marks = threading.Event(), RecordedMarks()
    layers = ForwardLayers(2, marks)
    layers.written(1)
    layers.written(2)
    layers.written(2)  # a repeated count adds no mark
    layers.finish(True)
    marks.done = 2
    assert layers.wait(0, stop) == 2 and "device drained" not in marks.waited


@pytest.mark.parametrize("mode", ["int8", "lynx", "bf16"])
def test_a_segment_streamed_layer_by_layer_sends_exactly_the_frames_of_a_whole_send(mode):
    side = ready_side(mode=mode)
    try:
        layers = side.begin_forward([(9, SLOTS)])
        assert layers is not None and layers.num_layers == LAYERS == 2
        layers.written(1)
        assert wait_for(lambda: frame_layers(side)), "layer 0's frames leave while the forward runs"
        assert side.sender.wait_idle(30)
        assert {end for _, _, end in frame_layers(side)} == {1}, "nothing of an unwritten layer is sent"
        layers.finish(True)
        side.add_chunk(9, SLOTS, True, 2, TOKENS)
        assert wait_for(lambda: side.host.succeeded) and side.sender.wait_idle(30)
        streamed = sent(side)
    finally:
        side.close()
    assert side.host.failures == []
    assert sorted(streamed) == sorted(whole_send(mode=mode))


def test_forwards_past_a_cached_prefix_hand_over_each_segment_once_and_send_what_a_whole_send_does():
    """The first forward computes tokens 4-12 after a cached prefix of 4 (slots from token 0 on):
    segment [0, 8) streams with it; a forward that completes no new segment streams nothing; the
    last forward streams the other two; the chunks then add nothing."""
    options = {"mode": "bf16", "segment_tokens": 8}
    side = ready_side(**options)
    try:
        first = side.begin_forward([(9, SLOTS[:12])])
        assert first is not None
        first.finish(True)
        side.add_chunk(9, SLOTS[:12], False, 2, 12)
        assert side.begin_forward([(9, SLOTS[:12])]) is None
        last = side.begin_forward([(9, SLOTS)])
        assert last is not None
        last.finish(True)
        side.add_chunk(9, SLOTS[12:], True, 2, TOKENS - 12)
        assert wait_for(lambda: side.host.succeeded) and side.sender.wait_idle(30)
        streamed = sent(side)
    finally:
        side.close()
    assert side.host.failures == []
    assert side.segments_sent == {"while_computed": 3, "after_forward": 0}
    assert sorted(streamed) == sorted(whole_send(**options))


def test_chunk_slots_other_than_those_streamed_fail_the_room():
    side = ready_side()
    try:
        layers = side.begin_forward([(9, SLOTS)])
        layers.finish(True)
        side.add_chunk(9, SLOTS + 100, True, 2, TOKENS)
        (room, reason), = side.host.failures
        assert room == 9 and "slots differ" in reason
    finally:
        side.close()


def test_an_abort_while_the_forward_runs_stops_the_rest_of_the_segment():
    side = ready_side()
    try:
        layers = side.begin_forward([(9, SLOTS)])
        layers.written(1)
        assert wait_for(lambda: frame_layers(side)) and side.sender.wait_idle(30)
        side.abort(9)
        layers.finish(True)
        assert side.encoder.drain(30) and side.sender.wait_idle(30)
        assert {end for _, _, end in frame_layers(side)} == {1}, "layer 1 was written after the abort"
    finally:
        side.close()


def test_a_failed_forward_fails_the_rooms_it_was_streaming():
    side = ready_side()
    try:
        layers = side.begin_forward([(9, SLOTS)])
        layers.finish(False)
        assert wait_for(lambda: side.host.failures)
        (room, reason), = side.host.failures
        assert room == 9 and "forward failed" in reason
    finally:
        side.close()


def test_layers_do_not_stream_when_segments_are_off():
    side = ready_side(segment_tokens=0)
    try:
        assert side.begin_forward([(9, SLOTS)]) is None
    finally:
        side.close()


def test_the_chunk_each_lynx_request_computes_is_read_past_the_decode_servers_prefix():
    """``(room, slots)`` from the first transferred token, a cached prefix included: tokens before
    `disagg_decode_prefix_len` are not transferred, and requests that compute none of those, or of
    other backends (SGLang's warmup), are left out."""
    import torch
    from types import SimpleNamespace

    from lynx_patches.pd.conn import LynxKVSender
    from lynx_patches.pd.layer_hooks import computed_chunks

    req_to_token = torch.arange(5 * 100).view(5, 100)

    def req(room, row, prefix, end, skipped, lynx=True):
        sender = object.__new__(LynxKVSender) if lynx else object()
        kv = SimpleNamespace(req_pool_idx=row)
        tokens = list(range(room * 1000, room * 1000 + end))  # no two requests share a token
        return SimpleNamespace(disagg_kv_sender=sender, kv=kv, bootstrap_room=room, prefix_len=prefix,
                               extend_end=end, disagg_decode_prefix_len=skipped, full_untruncated_fill_ids=tokens,
                               _compute_max_prefix_len=lambda n: n - 1)  # fmt: skip

    batch = SimpleNamespace(reqs=[req(1, 2, 0, 10, 0), req(2, 3, 40, 60, 50), req(3, 1, 0, 5, 0, lynx=False),
                                  req(4, 0, 0, 30, 30), req(5, 4, 40, 60, 10)])  # fmt: skip
    chunks = computed_chunks(batch, req_to_token, 1)
    assert [(room, slots.tolist()) for room, slots in chunks] == [
        (1, list(range(200, 210))), (2, list(range(350, 360))), (5, list(range(410, 460)))
    ]


def test_a_chunk_the_radix_cache_may_swap_to_cached_slots_does_not_stream():
    """SGLang's insert after the forward points a request at the tree's slots for tokens the tree
    already holds and frees its own: the match stopped at its cap (the prompt's last token, or
    prompt logprobs from the start) where the tree may hold more, or an earlier request of the
    batch (inserted first) computes the same tokens past the request's prefix."""
    from lynx_patches.pd.layer_hooks import may_be_deduplicated

    prompt = np.arange(100, 164)
    assert not may_be_deduplicated(prompt, 0, 63, [], 1)  # a new prompt
    assert may_be_deduplicated(prompt[:1], 0, 0, [], 1)  # a one-token prompt
    assert may_be_deduplicated(prompt, 0, 0, [], 1)  # prompt logprobs from the first token
    assert may_be_deduplicated(prompt, 32, 32, [], 1)  # ... from token 32, past a prefix of 32
    assert not may_be_deduplicated(prompt, 32, 63, [], 1)  # the next chunk of a prompt
    assert may_be_deduplicated(prompt[:16], 0, 15, [], 16)  # a single page: the match takes none of it
    assert not may_be_deduplicated(prompt[:20], 0, 19, [], 16)
    other = np.concatenate([prompt[:40], prompt[40:] + 1])
    assert may_be_deduplicated(prompt, 0, 63, [other], 1)  # the same new prompt twice in one batch
    assert may_be_deduplicated(prompt, 0, 63, [other], 32)
    assert not may_be_deduplicated(prompt, 0, 63, [other], 48)  # shares less than a page
    assert not may_be_deduplicated(prompt, 40, 63, [other], 1)  # shares nothing past the prefix
    assert not may_be_deduplicated(prompt, 0, 63, [prompt[:0], prompt[1:]], 1)


def test_only_the_later_of_two_equal_requests_in_a_batch_is_left_out():
    import torch
    from types import SimpleNamespace

    from lynx_patches.pd.conn import LynxKVSender
    from lynx_patches.pd.layer_hooks import computed_chunks

    def req(room, row, tokens):
        return SimpleNamespace(disagg_kv_sender=object.__new__(LynxKVSender), kv=SimpleNamespace(req_pool_idx=row),
                               bootstrap_room=room, prefix_len=0, extend_end=len(tokens), disagg_decode_prefix_len=0,
                               full_untruncated_fill_ids=tokens, _compute_max_prefix_len=lambda n: n - 1)  # fmt: skip

    same = list(range(50))
    batch = SimpleNamespace(reqs=[req(1, 0, same), req(2, 1, list(same)), req(3, 2, same[::-1])])
    assert [room for room, _ in computed_chunks(batch, torch.arange(3 * 60).view(3, 60), 1)] == [1, 3]


def test_only_an_extend_forward_run_whole_reports_its_layers():
    from types import SimpleNamespace

    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    def batch(mode, split=None):
        return SimpleNamespace(forward_mode=mode, tbo_split_seq_index=split)

    assert streams_layers_of(batch(ForwardMode.EXTEND))
    assert not streams_layers_of(batch(ForwardMode.DECODE))
    assert not streams_layers_of(batch(ForwardMode.SPLIT_PREFILL)), "PD multiplexing runs a forward's layers in parts"
    assert not streams_layers_of(batch(ForwardMode.EXTEND, split=2)), "two micro-batches write each layer in turn"
