"""`SlotWriter` on its own: where a segment goes, and the data thread's queue of rooms to upgrade.

Whole transfers through it (anchors, metadata, upgrades layer by layer) are in
test_segments and test_decode_side.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import torch
from lynx.transfer.room_lifecycle import Placement, Room
from lynx.transfer.rooms import RoomTable
from pd_fakes import HEADS, LAYERS, FakePool, config

from lynx.pd.decode_slots import SlotWriter, as_tensor, segment_slots


def _writer(fake=None):
    table, pool = RoomTable(10.0), (fake or FakePool(seed=1, slots=200)).view
    return table, pool, SlotWriter(table, lambda: pool, config().wires)


def test_a_segment_goes_to_its_own_slots_in_the_heads_its_manifest_placed():
    fake = FakePool(seed=1, slots=300)
    table, pool, writer = _writer(fake)
    entry = table.reserve(Room(7, np.arange(100, 250), 1, b"k" * 32, 0.0))
    whole = pool.shape(150, 1)
    segments = (whole.segment(0, 68), whole.segment(68, 82))
    table.start_receiving(7, "manifest", "assembly", placement=Placement(1, 1, segments))
    target = writer.target(entry, 1)
    assert target.shape == segments[1] and torch.equal(target.index, torch.arange(168, 250))
    assert len(target.k_buffers) == len(target.v_buffers) == LAYERS
    assert target.k_buffers[0].shape[1] == 1 < HEADS, "one head of the pool's: its second"
    assert target.v_buffers[1].data_ptr() == fake.v[1][:, 1].data_ptr()
    assert segment_slots(entry.slots, segments[0]).tolist() == list(range(100, 168))


def test_a_room_is_queued_once_and_leaves_the_queue_when_it_may_not_be_upgraded():
    table, _, writer = _writer()
    entry = table.reserve(Room(7, np.arange(4), 1, b"k" * 32, 0.0))
    writer.want(entry, SimpleNamespace(num_streams=1, upgradable=lambda: [0]))
    assert writer.waiting == (), "one stream: nothing to upgrade"
    writer.want(entry, SimpleNamespace(num_streams=2, upgradable=lambda: []))
    assert writer.waiting == (), "no residual landed yet"
    for _ in range(2):
        writer.want(entry, SimpleNamespace(num_streams=2, upgradable=lambda: [0]))
    assert writer.waiting == (7,)
    assert writer.step(7) is False and writer.waiting == (), "a reserved room is not upgraded"


def test_a_stream_buffer_is_seen_as_bytes_and_an_empty_one_too():
    assert as_tensor(bytearray(b"\x01\x02")).tolist() == [1, 2]
    assert as_tensor(np.zeros(0, dtype=np.uint8)).numel() == 0
    assert as_tensor(np.arange(3, dtype=np.uint16)).dtype == torch.uint8
