"""What the lynx backend's registry hands SGLang's decode path: a receiver's exact token count."""

from types import SimpleNamespace

import numpy as np
from sglang.srt.disaggregation.base.conn import KVPoll

from lynx_patches.pd import registry
from lynx_patches.pd.conn import LynxKVReceiver

PAGE_SIZE = 4


class _Side:
    """The decode side's reservation, recorded."""

    def __init__(self) -> None:
        self.reserved: list[tuple[int, list[int]]] = []

    def reserve(self, room, slots, aux_index, since, peer, endpoints, sources):
        self.reserved.append((room, slots.tolist()))


def _receiver(side: _Side) -> LynxKVReceiver:
    """A receiver that owns room 9 and has no prefill to reach (SGLang's own `send_metadata`
    then records a failure and returns)."""
    receiver = object.__new__(LynxKVReceiver)
    receiver._lynx_owner, receiver.conclude_state = True, KVPoll.Bootstrapping
    receiver.lynx_side, receiver.bootstrap_room, receiver.created_at, receiver.bootstrap_addr = side, 9, 0.0, "peer"
    receiver.bootstrap_infos = None
    receiver.kv_mgr = SimpleNamespace(
        kv_args=SimpleNamespace(page_size=PAGE_SIZE), record_failure=lambda *a: None, update_status=lambda *a: None
    )
    return receiver


def _send_kv_metadata(queue, decode_req, kv_indices, page_size, state_indices=None, **metadata_kwargs):
    """SGLang's `DecodePreallocQueue._send_kv_metadata`, as far as the receiver sees it."""
    decode_req.kv_receiver.send_metadata(kv_indices, 0, state_indices, **metadata_kwargs)


def test_a_lynx_receiver_reserves_the_prompt_tokens_past_the_decode_prefix_not_its_whole_pages():
    side = _Side()
    prompt = list(range(10))
    decode_req = SimpleNamespace(kv_receiver=_receiver(side), req=SimpleNamespace(origin_input_ids=prompt))
    registry.send_kv_metadata(_send_kv_metadata, None, decode_req, np.array([3, 5, 6]), PAGE_SIZE, decode_prefix_len=2)
    assert side.reserved == [(9, [12, 13, 14, 15, 20, 21, 22, 23])]  # 8 tokens of the 12 slots


def test_without_the_count_a_lynx_receiver_reserves_every_slot_of_its_pages():
    side = _Side()
    _receiver(side).send_metadata(np.array([3, 5]), 0)
    assert side.reserved == [(9, [12, 13, 14, 15, 20, 21, 22, 23])]


def test_another_backends_receiver_gets_sglangs_arguments_unchanged():
    calls = []
    decode_req = SimpleNamespace(kv_receiver=object(), req=SimpleNamespace(origin_input_ids=[1, 2, 3]))
    registry.send_kv_metadata(lambda *a, **kw: calls.append((a, kw)), "queue", decode_req, [1], 1, decode_prefix_len=0)
    assert calls == [(("queue", decode_req, [1], 1), {"decode_prefix_len": 0})]
