"""Whether a room's manifest fits this decode rank, and where the KV it announces goes.

A decode rank takes a room's one manifest (opened with the room's transfer
key, `lynx.manifest.open_manifest`) only if the heads it carries lie inside
this rank's share (`lynx.heads.placement`), its mode, preset, KV layout and
exact token count match what the rank reserved (`Manifest.mismatch`), and its
metadata is the size of this server's rows. An accepted manifest gives the
room's `Placement`, the `SegmentedAssembly` its frames go into, and its cap:
one transfer timeout per frame and per segment. Under tensor parallelism the
parts of a request must between them carry exactly this rank's heads
(`coverage`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from lynx.config import LynxConfig
from lynx.heads import HeadShard, HeadSlice, coverage_problem, placement
from lynx.kvwire import WireFormat
from lynx.manifest import Manifest
from lynx.transfer.room_lifecycle import Placement, Room
from lynx.transfer.segments import SegmentedAssembly

from lynx.pd.pool import PoolView


class RefusedManifest(ValueError):
    """The manifest cannot be received here; the message is the room's failure reason."""


class Accepted(NamedTuple):
    """What an accepted manifest sets up for its room (`RoomTable.start_receiving`)."""

    placement: Placement
    assembly: SegmentedAssembly
    cap_s: float


def accept_manifest(entry: Room, manifest: Manifest, pool: PoolView, wire: WireFormat, config: LynxConfig) -> Accepted:
    """Check `manifest` (sent in `wire`, this rank's format for its mode) against the reserved
    `entry` and this rank's `pool`; what it sets up.

    Raises:
        RefusedManifest: why it does not fit.
    """
    try:
        head_offset = placement(pool.shard, manifest.first_head, manifest.kv_heads)
    except ValueError as exc:
        raise RefusedManifest(f"rejected manifest: {exc}") from None
    problem = manifest.mismatch(wire, pool.shape(entry.num_tokens, manifest.kv_heads), config.preset)
    if problem is None and manifest.aux_size != pool.aux_size:
        problem = f"aux of {manifest.aux_size} bytes, this server's metadata rows are different"
    if problem is not None:
        raise RefusedManifest(problem)
    segments = tuple(wire.segment_shapes(manifest.shape, manifest.segment_tokens))
    assembly = SegmentedAssembly(entry.room, manifest.segment_sizes(wire), manifest.aux_size)
    frames = manifest.frame_count(wire, config.chunk_bytes)
    cap_s = config.transfer_timeout * (frames + len(segments))  # one timeout per frame and per segment
    return Accepted(Placement(head_offset, manifest.kv_heads, segments), assembly, cap_s)


def coverage(shard: HeadShard, manifests: Sequence[Manifest | None]) -> str | None:
    """Once every part of a request is announced (no None among the parts' `manifests`): why the
    heads they carry are not exactly this rank's `shard`, or None."""
    if any(manifest is None for manifest in manifests):
        return None
    return coverage_problem(shard, [HeadSlice(m.first_head, m.kv_heads) for m in manifests])
