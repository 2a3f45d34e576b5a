"""Small fakes for unit tests of the Lynx PD sides: a KV pool, the engine hosts, and a prefill's messages.

The pool is real tensors behind a real `PoolView`; the hosts record what the
sides report; `transfer_messages` builds exactly what a prefill rank sends for
one room (manifest, then frames) with the library's own encoders.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass, field

import numpy as np
import torch
from lynx.config import LynxConfig
from lynx.manifest import Manifest, dtype_name
from lynx.transfer.frames import AUX_STREAM, FrameHeader, encode_frame
from lynx.transfer.policy import chunk_spans

from lynx_patches.pd.pool import PoolView

LAYERS, HEADS, DIM, SLOTS = 2, 2, 64, 64
AUX_LENS = (8, 16)
SECRET = b"unit-test-secret-0123456789abcdef"


@dataclass
class FakePool:
    """Per-layer bf16 K/V tensors and metadata rows, with their `PoolView` (page size 1)."""

    seed: int = 0
    slots: int = SLOTS

    def __post_init__(self) -> None:
        g = torch.Generator().manual_seed(self.seed)
        self.k = [torch.randn(self.slots, HEADS, DIM, generator=g).to(torch.bfloat16) for _ in range(LAYERS)]
        self.v = [torch.randn(self.slots, HEADS, DIM, generator=g).to(torch.bfloat16) for _ in range(LAYERS)]
        self.aux_rows = [np.zeros((4, n), dtype=np.uint8) for n in AUX_LENS]
        ptrs = tuple(row.ctypes.data_as(ctypes.c_void_p).value for row in self.aux_rows)
        self.view = PoolView(tuple(self.k), tuple(self.v), 1, ptrs, AUX_LENS)

    def snapshot(self, slots) -> list[torch.Tensor]:
        return [t[list(slots)].clone() for t in self.k + self.v]


@dataclass
class DecodeHost:
    """Records what a `DecodeSide` reports to the engine."""

    succeeded: list = field(default_factory=list)
    failures: list = field(default_factory=list)
    moving: list = field(default_factory=list)
    cancelled: list = field(default_factory=list)

    def succeed(self, room):
        self.succeeded.append(room)

    def fail(self, room, reason):
        self.failures.append((room, reason))

    def transferring(self, room):
        self.moving.append(room)

    def cancel(self, room, endpoints):
        self.cancelled.append(room)


@dataclass
class PrefillHost:
    """Records what a `PrefillSide` reports to the engine."""

    attn_tp_size: int = 1
    ready: list = field(default_factory=list)
    succeeded: list = field(default_factory=list)
    failures: list = field(default_factory=list)

    def room_ready(self, room, decode_prefix_len):
        self.ready.append((room, decode_prefix_len))

    def succeed(self, room):
        self.succeeded.append(room)

    def fail(self, room, reason, notify=()):
        self.failures.append((room, reason))

    def failed(self, room):
        return any(r == room for r, _ in self.failures)


def config(**options) -> LynxConfig:
    return LynxConfig(**{"mode": "lynx", "transfer_timeout": 30.0, "chunk_bytes": 4096, **options})


def transfer_messages(config: LynxConfig, source: FakePool, src_slots, room: int, key: bytes, aux: bytes):
    """``(manifest_parts, frames_by_stream)`` a prefill rank sends for `room` (frames in send order)."""
    wire = config.wire
    index = torch.tensor(list(src_slots), dtype=torch.int64)
    streams = wire.encode(source.k, source.v, index)
    shape = source.view.shape(len(src_slots))
    manifest = Manifest(
        room, wire.mode, config.preset, shape.num_layers, shape.num_tokens, shape.kv_heads, shape.head_dim,
        dtype_name(shape.dtype), tuple(int(s.numel()) for s in streams), len(aux),
    )  # fmt: skip
    frames: dict[int, list] = {}
    named = [(AUX_STREAM, np.frombuffer(aux, dtype=np.uint8))] + [(i, s.numpy()) for i, s in enumerate(streams)]
    for stream, data in named:
        spans = chunk_spans(len(data), config.chunk_bytes)
        frames[stream] = [
            [bytes(p) for p in encode_frame(FrameHeader(room, stream, i, len(spans), off, n, 0, 0), data[off : off + n].tobytes(), key)]
            for i, (off, n) in enumerate(spans)
        ]
    return manifest, frames


def wait_for(condition, timeout_s: float = 30.0) -> bool:
    """Poll `condition` until it is true or `timeout_s` passes; its last value."""
    import time

    deadline = time.monotonic() + timeout_s
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.01)
    return bool(condition())
