"""A prefill forward's layers as they are written: the KV of a segment leaves layer by layer.

`run_batch` (an AROUND hook on `Scheduler.run_batch`) hands the prefill side
the chunk each Lynx request computes in this forward; for the segments that
chunk completes the side returns a `ForwardLayers`, which the `set_kv_buffer`
hook advances layer by layer while the encoder thread encodes and sends what
is written. The end of the forward completes it whatever the hooks saw.

On the CPU platform the forward runs synchronously: the KV of layer ``l`` is
in the pool when the hook for layer ``l`` runs. On a GPU the hook runs when the
write is queued, not done, so each advance records an event on the forward's
stream (`DeviceMarks`) and the encoder thread waits for it before reading; a
forward whose hooks did not report every layer (its KV written elsewhere)
completes at a device-wide synchronization instead.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from contextvars import ContextVar
from typing import NamedTuple, Protocol

import numpy as np
import torch

from lynx_patches import targets
from lynx_patches.pd.registry import manager_of
from lynx_patches.selfcheck import Hook

# Set by `run_batch` around a prefill forward that streams layers: called with the
# number of layers whose KV is written so far.
LAYERS_WRITTEN: ContextVar[Callable[[int], None] | None] = ContextVar("lynx_layers_written", default=None)


class Mark(Protocol):
    """A point in a device's queued work (a device event): `query` says whether the device has
    reached it, `synchronize` blocks until it has."""

    def query(self) -> bool: ...

    def synchronize(self) -> None: ...


class DeviceMarks:
    """Marks in the work queued on a GPU pool's device, to wait for from another thread.

    `mark` records an event on the calling thread's current stream (in the
    `set_kv_buffer` hook: the forward's stream, after that layer's write);
    `everything` stands for all work queued on the device when it is waited for.
    """

    def __init__(self, device: torch.device) -> None:
        self._device = device

    def mark(self) -> Mark:
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(self._device))
        return event

    def everything(self) -> Mark:
        return _DeviceDrain(self._device)


class _DeviceDrain(NamedTuple):
    device: torch.device

    def query(self) -> bool:
        return False  # not known without waiting

    def synchronize(self) -> None:
        torch.cuda.synchronize(self.device)


class ForwardLayers:
    """How many layers of one prefill forward have their KV in the pool.

    The scheduler thread advances it (`written`) and ends it (`finish`); the
    encoder thread waits on it (`wait`). With `marks` (a GPU pool) a layer
    counts as written once the device has reached the mark recorded with it;
    the host queues a forward far ahead of the device, so the encoder takes
    the layers the device has done, not all those reported.
    """

    def __init__(self, num_layers: int, marks: DeviceMarks | None = None) -> None:
        self.num_layers = num_layers
        self._marks = marks
        self._cond = threading.Condition()
        self._written = 0
        self._ready: list[tuple[int, Mark]] = []  # (layer count, its mark), counts rising (GPU pools)
        self._failed = False

    def written(self, count: int) -> None:
        """The KV of the first `count` layers is written (on a GPU: queued on the current stream)."""
        mark = self._marks.mark() if self._marks is not None else None
        with self._cond:
            if count > self._written:
                self._written = min(count, self.num_layers)
                if mark is not None:
                    self._ready.append((self._written, mark))
                self._cond.notify_all()

    def finish(self, completed: bool) -> None:
        """The forward returned (every layer written, or queued) or raised (nothing more will be)."""
        with self._cond:
            if completed:
                if self._written < self.num_layers and self._marks is not None:
                    self._ready.append((self.num_layers, self._marks.everything()))
                self._written = self.num_layers
            else:
                self._failed = True
            self._cond.notify_all()

    def wait(self, beyond: int, stop: threading.Event, poll_s: float = 0.5) -> int | None:
        """Block until more than `beyond` layers are written (on a GPU: until the device has written
        them); their count, or None if the forward failed (or `stop` is set) first."""
        with self._cond:
            while self._written <= beyond and not self._failed and not stop.is_set():
                self._cond.wait(poll_s)
            if self._written <= beyond:
                return None
            if self._marks is None:
                return self._written
            pending = [(count, mark) for count, mark in self._ready if count > beyond]
        return _reached(pending)


def _reached(pending: list[tuple[int, Mark]]) -> int:
    """The most layers the device has written of `pending` ``(count, mark)`` (counts rising, marks in
    one stream's order, so a mark reached means every earlier one was): waits for the first mark
    if the device has reached none."""
    first_count, first_mark = pending[0]
    first_mark.synchronize()
    reached = first_count
    for count, mark in pending[1:]:
        if not mark.query():
            break
        reached = count
    return reached


def computed_chunks(batch, req_to_token, page_size: int) -> list[tuple[int, np.ndarray]]:
    """``(room, slots)`` of each Lynx request of an extend batch that computes tokens the decode
    server lacks: the pool slots of its transfer positions from the first (past what the decode
    server already holds, `disagg_decode_prefix_len`) through the end of this chunk. Positions
    before `prefix_len` are cached or computed earlier; the side hands over only what it has not.
    A chunk whose slots the radix cache may swap after the forward (`may_be_deduplicated`) is left
    out: its segments are sent from the slots the chunk ends up in, once the forward is done."""
    from lynx_patches.pd.conn import LynxKVSender

    chunks, earlier = [], []
    for req in batch.reqs:
        tokens = np.asarray(req.full_untruncated_fill_ids, dtype=np.int64)[: req.extend_end]
        skipped = req.disagg_decode_prefix_len
        streams = isinstance(req.disagg_kv_sender, LynxKVSender) and req.kv.req_pool_idx is not None
        if streams and req.extend_end > max(req.prefix_len, skipped):
            cap = req._compute_max_prefix_len(len(req.full_untruncated_fill_ids))
            if not may_be_deduplicated(tokens, req.prefix_len, cap, earlier, page_size):
                slots = req_to_token[req.kv.req_pool_idx, skipped : req.extend_end].cpu().numpy().astype(np.int64)
                chunks.append((req.bootstrap_room, slots))
        earlier.append(tokens)
    return chunks


def may_be_deduplicated(
    tokens: np.ndarray, prefix_len: int, cap: int, earlier: list[np.ndarray], page_size: int
) -> bool:
    """Whether the prefill's radix cache may hand a request other slots for tokens of the chunk it
    computes (`tokens[prefix_len:]`) when the chunk is inserted after the forward: where the tree
    already holds them, SGLang frees the chunk's own slots and points the request at the tree's.

    That happens when the prefix match stopped at its cap (`cap`: one token short of the prompt,
    or `logprob_start_len`) and not at the end of what the tree holds, e.g. a prompt sent again
    with prompt logprobs from its start, or a one-token prompt sent again; and when a request
    before it in the same batch (inserted first) computes the same tokens past `prefix_len`, e.g.
    the same new prompt twice in one batch. Conservative: it may say yes where the tree holds
    nothing."""
    if cap // page_size * page_size <= prefix_len:
        return True
    reach = prefix_len + page_size  # the insert dedups whole pages only
    for other in earlier:
        n = min(len(other), len(tokens))
        if n < reach:
            continue
        parted = np.flatnonzero(other[:n] != tokens[:n])
        if (parted[0] if len(parted) else n) >= reach:
            return True
    return False


def streams_layers_of(batch) -> bool:
    """Whether a forward of `batch` may report its layers as written: an extend forward run whole,
    not split across calls (PD multiplexing) nor into two overlapped micro-batches, whose second
    writes a layer after the first reported it."""
    mode = batch.forward_mode
    return mode.is_extend() and not mode.is_split_prefill() and getattr(batch, "tbo_split_seq_index", None) is None


def run_batch(original, scheduler, batch, *args, **kwargs):
    """AROUND `Scheduler.run_batch`: on a Lynx prefill server, the segments this forward completes
    are encoded and sent layer by layer while it runs."""
    manager = manager_of(scheduler)
    prefill = manager is not None and not manager.is_decode and manager.side.streams_layers
    if not prefill or batch is None or not streams_layers_of(batch):
        return original(scheduler, batch, *args, **kwargs)
    layers = manager.side.begin_forward(
        computed_chunks(batch, scheduler.req_to_token_pool.req_to_token, scheduler.page_size)
    )
    if layers is None:
        return original(scheduler, batch, *args, **kwargs)
    token = LAYERS_WRITTEN.set(layers.written)
    completed = False
    try:
        result = original(scheduler, batch, *args, **kwargs)
        completed = True
        return result
    finally:
        LAYERS_WRITTEN.reset(token)
        layers.finish(completed)


def kv_written(result, pool, layer, *args, **kwargs):
    """AFTER `MHATokenToKVPool.set_kv_buffer`: in a streaming prefill forward, layer `layer` is written."""
    notify = LAYERS_WRITTEN.get()
    if notify is not None and layer is not None:
        notify(layer.layer_id - pool.start_layer + 1)
    return None


HOOKS = (
    Hook(targets.SCHEDULER_RUN_BATCH, run_batch, "AROUND"),
    Hook(targets.MHA_SET_KV_BUFFER, kv_written, "AFTER"),
)
