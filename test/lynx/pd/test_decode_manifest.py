"""`accept_manifest` and `coverage`: which manifests a decode rank takes, and what an accepted one sets up."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from lynx.heads import HeadShard
from lynx.transfer.room_lifecycle import Room
from pd_fakes import AUX_LENS, HEADS, SHARD, FakePool, config, transfer_messages

from lynx.pd.decode_manifest import RefusedManifest, accept_manifest, coverage

TOKENS = 150


def _setup(tokens=TOKENS):
    cfg = config()
    source = FakePool(seed=0, slots=TOKENS)
    manifest, _ = transfer_messages(cfg, source, range(tokens), 7, b"k" * 32, bytes(sum(AUX_LENS)))
    entry = Room(7, np.arange(TOKENS), 1, b"k" * 32, 0.0)
    return cfg, manifest, entry, FakePool(seed=1, slots=TOKENS).view


def test_an_accepted_manifest_places_every_head_sets_up_its_segments_and_caps_the_transfer():
    cfg, manifest, entry, pool = _setup()
    manifest = replace(manifest, segment_tokens=64)
    manifest = replace(manifest, stream_sizes=tuple(map(sum, zip(*manifest.segment_sizes(cfg.wire)))))
    accepted = accept_manifest(entry, manifest, pool, cfg.wire, cfg)
    assert (accepted.placement.head_offset, accepted.placement.heads) == (0, HEADS)
    firsts = [shape.first_token for shape in accepted.placement.segments]
    assert sum(shape.num_tokens for shape in accepted.placement.segments) == TOKENS and firsts == sorted(firsts)
    assert accepted.assembly.num_segments == len(accepted.placement.segments) == 3
    frames = manifest.frame_count(cfg.wire, cfg.chunk_bytes)
    assert accepted.cap_s == cfg.transfer_timeout * (frames + len(accepted.placement.segments))


def test_a_manifest_for_another_token_count_is_refused_naming_both():
    cfg, manifest, entry, pool = _setup(tokens=TOKENS - 1)
    with pytest.raises(RefusedManifest, match=f"{TOKENS - 1} tokens announced, {TOKENS} slots reserved"):
        accept_manifest(entry, manifest, pool, cfg.wire, cfg)


def test_heads_outside_this_ranks_share_are_a_rejected_manifest():
    cfg, manifest, entry, pool = _setup()
    with pytest.raises(RefusedManifest, match=r"^rejected manifest: heads \[1, 3\) announced"):
        accept_manifest(entry, replace(manifest, first_head=1), pool, cfg.wire, cfg)


def test_metadata_of_another_size_is_refused():
    cfg, manifest, entry, pool = _setup()
    with pytest.raises(RefusedManifest, match="aux of 3 bytes"):
        accept_manifest(entry, replace(manifest, aux_size=3), pool, cfg.wire, cfg)


def test_coverage_waits_for_every_part_then_wants_exactly_this_ranks_heads():
    _, manifest, _, _ = _setup()
    halves = [replace(manifest, kv_heads=1, first_head=h) for h in (0, 1)]
    assert coverage(SHARD, [halves[0], None]) is None, "a part is still to announce"
    assert coverage(SHARD, halves) is None
    assert "overlapping KV heads" in coverage(SHARD, [halves[0], halves[0]])
    assert "sends KV heads [1]" in coverage(SHARD, [halves[0]])
    assert coverage(HeadShard(1, 0, HEADS, HEADS), [manifest]) is None
