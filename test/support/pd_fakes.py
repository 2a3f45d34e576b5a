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
from lynx.heads import HeadShard
from lynx.manifest import Manifest, dtype_name
from lynx.transfer.frames import AUX_STREAM, FrameHeader, encode_frame
from lynx.transfer.policy import chunk_spans
from lynx.transfer.transport import Transport

from lynx.pd.pool import PoolView

LAYERS, HEADS, DIM, SLOTS = 2, 2, 64, 64
SHARD = HeadShard(1, 0, HEADS, HEADS)  # what a TP 1 rank of these pools holds
AUX_LENS = (8, 16)
SECRET = b"unit-test-secret-0123456789abcdef"


@dataclass
class FakePool:
    """Per-layer bf16 K/V tensors and metadata rows, with their `PoolView` (page size 1).

    `shard` says which KV heads of a tensor-parallel model the pool holds (its
    ``heads`` of them); None is every head (`heads`), on one rank. The tensors
    are made on the CPU from `seed`, then moved to `device`.
    """

    seed: int = 0
    slots: int = SLOTS
    shard: HeadShard | None = None
    layers: int = LAYERS
    heads: int = HEADS
    head_dim: int = DIM
    device: str = "cpu"

    def __post_init__(self) -> None:
        g = torch.Generator().manual_seed(self.seed)
        shape = (self.slots, self.heads if self.shard is None else self.shard.heads, self.head_dim)
        self.k = [torch.randn(shape, generator=g).to(torch.bfloat16).to(self.device) for _ in range(self.layers)]
        self.v = [torch.randn(shape, generator=g).to(torch.bfloat16).to(self.device) for _ in range(self.layers)]
        self.aux_rows = [np.zeros((4, n), dtype=np.uint8) for n in AUX_LENS]
        ptrs = tuple(row.ctypes.data_as(ctypes.c_void_p).value for row in self.aux_rows)
        self.view = PoolView(tuple(self.k), tuple(self.v), 1, ptrs, AUX_LENS, self.shard)

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
    notified: list = field(default_factory=list)  # (room, the decode ranks told of its failure)

    def room_ready(self, room, decode_prefix_len):
        self.ready.append((room, decode_prefix_len))

    def succeed(self, room):
        self.succeeded.append(room)

    def fail(self, room, reason, notify=()):
        self.failures.append((room, reason))
        self.notified.append((room, tuple(notify)))

    def failed(self, room):
        return any(r == room for r, _ in self.failures)


class Recorder(Transport):
    """A transport that keeps every message it is given, as (endpoint, parts as bytes)."""

    def __init__(self):
        self.sent = []

    def send(self, endpoint, parts):
        self.sent.append((endpoint, [bytes(p) for p in parts]))

    def close(self):
        pass


def config(**options) -> LynxConfig:
    return LynxConfig(**{"mode": "lynx", "transfer_timeout": 30.0, "chunk_bytes": 4096, **options})


PEER_SESSION = "127.0.0.1:5000"  # the one decode rank a recording prefill side sends to
PEER_NONCE = bytes(range(16))
PEER_ENDPOINT = "tcp://127.0.0.1:6000"


def decode_registration(issued_ns=10, version=None, aux=AUX_LENS, heads=SHARD):
    """The registration of the decode rank `PEER_SESSION` (this wire version unless told)."""
    from lynx.manifest import wire_version

    from lynx.pd.control import DecodeRegistration

    return DecodeRegistration(
        "127.0.0.1", 5000, PEER_SESSION, heads.tp_rank, heads.tp_size, aux, version or wire_version(), issued_ns, heads
    )


def room_metadata(room=9, tokens=20, endpoint=PEER_ENDPOINT):
    """`PEER_SESSION`'s metadata of one room: `tokens` tokens to `endpoint`, under `PEER_NONCE`."""
    from lynx.pd.control import RoomMetadata

    return RoomMetadata(room, "127.0.0.1", 5000, PEER_SESSION, 1, False, 0, tokens, PEER_NONCE, endpoint)


def recording_prefill_side(clock=None, **options):
    """A `PrefillSide` over a `FakePool` whose sender hands every message to a `Recorder`
    (`side.transport`), and whose host is a `PrefillHost` (`side.host`); threads not started."""
    from lynx.pd.prefill_side import PrefillSide

    host = PrefillHost()
    side = PrefillSide(config(**{"mode": "int8", **options}), SECRET, host, "127.0.0.1", **({"clock": clock} if clock else {}))
    side.transport.close()
    side.transport = side.sender._transport = Recorder()
    side.source = FakePool(seed=0)  # kept alive: the view holds raw addresses of its metadata rows
    side.attach(side.source.view)
    side.host = host
    return side


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


class LockstepGroup:
    """The CPU group of `size` decode ranks, each run in its own thread (`run_ranks`):
    every collective waits for all of them, as gloo's do, and lists must line up."""

    def __init__(self, size: int) -> None:
        import threading

        self.size = size
        self._barrier = threading.Barrier(size)
        self._slots: list = [None] * size

    def _exchange(self, rank: int, obj) -> list:
        self._slots[rank] = obj
        self._barrier.wait(timeout=10)
        everyone = list(self._slots)
        self._barrier.wait(timeout=10)
        return everyone

    def agreement(self, rank: int):
        """Rank `rank`'s `RankAgreement` over this group."""
        from lynx_patches.speculate.agree import RankAgreement

        def reduce_max(flags):
            everyone = self._exchange(rank, list(flags))
            if any(len(other) != len(flags) for other in everyone):
                raise AssertionError(f"ranks reduce lists of different lengths: {everyone}")
            return [max(column) for column in zip(*everyone)]

        return RankAgreement(reduce_max, lambda obj: self._exchange(rank, obj), self.size)


def run_ranks(worlds, step):
    """Run `step(world)` for every rank's world at once, one thread each; re-raise the first error."""
    import threading

    errors, results = [], [None] * len(worlds)

    def run(index):
        try:
            results[index] = step(worlds[index])
        except BaseException as exc:  # re-raised below, in the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(worlds))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    if errors:
        raise errors[0]
    return results


def gloo_agreement_rank(rank: int, port: int, views, out) -> None:
    """One rank of a real two-process gloo group (a spawned process): agree `views[rank]`, gather a
    reason from rank 1, put ``(rank, size, agreed, reasons)`` on `out`."""
    from types import SimpleNamespace

    import torch.distributed as dist

    from lynx_patches.speculate.agree import RankAgreement

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        agreement = RankAgreement.of(SimpleNamespace(attn_tp_cpu_group=dist.new_group(backend="gloo")))
        agreed = agreement.agree(views[rank])
        reasons = agreement.reasons(["lost here" if rank == 1 else None])
        out.put((rank, agreement.size, [int(r) for r in agreed], reasons))
    finally:
        dist.destroy_process_group()
