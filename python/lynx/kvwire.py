"""What a request's KV cache looks like on the wire in each `--lynx-mode`.

A request's KV is sent as one byte stream per priority class; each stream is
the concatenation over layers of that layer's stream. The four modes share
this shape, so they go through the same transport and compare fairly:

* ``bf16``: one stream, each layer's K then V exactly as stored (no codec).
* ``int8``: one stream, each layer's ``int8`` preset streams (anchor then
  residual) back to back; decoding waits for all of it.
* ``int4``: one stream, the 4-bit anchor only (lossy).
* ``lynx``: the preset's stages, anchor first (e.g. 4 + 4 bits).

``int8`` mode carries exactly the bytes of ``lynx`` mode with the ``int8``
preset, joined, so once the residual has landed their KV is bit-identical.

A long prompt's KV may travel in **segments** (`WireFormat.segments`), each
encoded as soon as the prefill has computed it. Segment boundaries fall on the
codec's key groups (after the sink tokens), and only the first segment holds
the sink tokens, so the segments decode to exactly what one whole encoding
decodes to.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from itertools import accumulate

import torch

from lynx.codec import CodecSpec, EncodedKV
from lynx.codec.codec import as_bytes
from lynx.codec.pool import gather_encode, scatter_decode, scatter_upgrade

@dataclass(frozen=True)
class KVShape:
    """Shape of (a segment of) one request's KV: per layer, K and V are ``[num_tokens, kv_heads, head_dim]``.

    ``first_token`` is the position of the segment's first token within the
    transfer (0 for a whole request).
    """

    num_layers: int
    num_tokens: int
    kv_heads: int
    head_dim: int
    dtype: torch.dtype
    first_token: int = 0

    def __post_init__(self) -> None:
        for name in ("num_layers", "num_tokens", "kv_heads", "head_dim", "first_token"):
            value = getattr(self, name)
            smallest = 0 if name in ("num_tokens", "first_token") else 1  # 0 tokens: all already held
            if not isinstance(value, int) or value < smallest:
                raise ValueError(f"{name} must be an int >= {smallest}, got {value!r}")

    def segment(self, first_token: int, num_tokens: int) -> KVShape:
        """The shape of tokens ``[first_token, first_token + num_tokens)`` of this KV."""
        return replace(self, num_tokens=num_tokens, first_token=first_token)


@dataclass(frozen=True)
class WireFormat:
    """The streams of one mode.

    Attributes:
        mode: the ``--lynx-mode``.
        spec: the codec; None for the uncompressed ``bf16`` mode.
        joined: each layer's codec streams travel back to back as one stream.
    """

    mode: str
    spec: CodecSpec | None
    joined: bool = False

    @classmethod
    def for_mode(cls, mode: str, preset: str) -> WireFormat:
        formats = {
            "bf16": (None, False),
            "int8": (CodecSpec.preset("int8"), True),
            "int4": (CodecSpec.preset("int4"), False),
            "lynx": (CodecSpec.preset(preset), False),
        }
        if mode not in formats:
            raise ValueError(f"unknown mode {mode!r}; expected one of {', '.join(formats)}")
        return cls(mode, *formats[mode])

    @property
    def num_streams(self) -> int:
        return 1 if self.spec is None or self.joined else self.spec.num_stages

    def segments(self, num_tokens: int, segment_tokens: int) -> list[tuple[int, int]]:
        """``(first_token, num_tokens)`` of each segment of a `num_tokens`-token transfer.

        Segment ``k`` ends at the last key-group boundary (``sink_tokens + m *
        key_group_tokens``) at or before ``(k + 1) * segment_tokens``, so it is
        complete once the prefill has computed the first ``(k + 1) *
        segment_tokens`` tokens: with SGLang's chunked prefill in chunks of
        `segment_tokens`, each segment can go as soon as the chunk it ends in
        is computed. `segment_tokens` (0: one segment) must be a multiple of
        the codec's key group; a transfer of at most `segment_tokens` tokens is
        one segment.
        """
        sinks, group = (0, 1) if self.spec is None else (self.spec.sink_tokens, self.spec.key_group_tokens)
        if not isinstance(segment_tokens, int) or segment_tokens < 0 or segment_tokens % group:
            raise ValueError(f"segment_tokens must be 0 or a positive multiple of {group}, got {segment_tokens!r}")
        if segment_tokens == 0 or num_tokens <= segment_tokens:
            return [(0, num_tokens)]
        ends = {sinks + (end - sinks) // group * group for end in range(segment_tokens, num_tokens, segment_tokens)}
        bounds = [0, *sorted(end for end in ends if end > 0), num_tokens]
        return [(start, end - start) for start, end in zip(bounds, bounds[1:])]

    def segment_shapes(self, shape: KVShape, segment_tokens: int) -> list[KVShape]:
        """The shape of each segment of `shape`'s tokens (see `segments`)."""
        return [shape.segment(first, count) for first, count in self.segments(shape.num_tokens, segment_tokens)]

    def layer_stream_bytes(self, shape: KVShape) -> tuple[int, ...]:
        """Bytes of each stream for one layer."""
        if shape.num_tokens == 0:
            return (0,) * self.num_streams
        if self.spec is None:
            elem = torch.empty((), dtype=shape.dtype).element_size()
            return (2 * shape.num_tokens * shape.kv_heads * shape.head_dim * elem,)
        sizes = self._codec_stream_bytes(shape)
        return (sum(sizes),) if self.joined else sizes

    def layer_bounds(self, shape: KVShape) -> list[list[int]]:
        """Per stream, cumulative byte offsets ``[0, end of layer 0, ..., total]``."""
        per_layer = self.layer_stream_bytes(shape)
        return [list(accumulate([0] + [size] * shape.num_layers)) for size in per_layer]

    def stream_sizes(self, shape: KVShape) -> tuple[int, ...]:
        return tuple(size * shape.num_layers for size in self.layer_stream_bytes(shape))

    def encode(
        self,
        k_pools: Sequence[torch.Tensor],
        v_pools: Sequence[torch.Tensor],
        token_indices: torch.Tensor,
        first_token: int = 0,
    ) -> list[torch.Tensor]:
        """Read a request's KV (or one segment of it) from per-layer pools and return its streams.

        Args:
            k_pools, v_pools: per layer ``[pool_size, kv_heads, head_dim]``.
            token_indices: int64 ``[num_tokens]`` slots of the request.
            first_token: position of the first slot's token in the transfer
                (a segment's start, see `segments`).

        Returns:
            One 1-D uint8 tensor per stream, layers concatenated in order.
        """
        spec = self._spec(first_token)
        if len(token_indices) == 0:
            return [torch.empty(0, dtype=torch.uint8) for _ in range(self.num_streams)]
        per_stream: list[list[torch.Tensor]] = [[] for _ in range(self.num_streams)]
        for k_pool, v_pool in zip(k_pools, v_pools, strict=True):
            if self.spec is None:
                layer = [as_bytes(k_pool[token_indices]), as_bytes(v_pool[token_indices])]
                per_stream[0].append(torch.cat(layer))
                continue
            encoded = gather_encode(k_pool, v_pool, token_indices, spec)
            layer = [torch.cat(encoded.streams)] if self.joined else encoded.streams
            for stream, data in zip(per_stream, layer, strict=True):
                stream.append(data)
        return [to_host(torch.cat(parts)) for parts in per_stream]

    def write(
        self,
        streams: Sequence[torch.Tensor],
        shape: KVShape,
        k_pools: Sequence[torch.Tensor],
        v_pools: Sequence[torch.Tensor],
        token_indices: torch.Tensor,
    ) -> None:
        """Dequantize the received streams (a prefix: anchor first) into pool slots.

        Args:
            streams: the first ``n`` streams, each 1-D uint8 of the full size.
            shape: the request's KV shape, as announced by the sender.
            k_pools, v_pools: per layer ``[pool_size, kv_heads, head_dim]``.
            token_indices: int64 ``[num_tokens]`` destination slots.
        """
        for k_pool, v_pool, parts in self._layers(streams, shape, k_pools, v_pools):
            if self.spec is None:
                k_bytes, v_bytes = parts[0].chunk(2)
                k_pool[token_indices] = _typed(k_bytes, shape, k_pool)
                v_pool[token_indices] = _typed(v_bytes, shape, v_pool)
                continue
            encoded = self._encoded(parts, shape)
            scatter_decode(encoded, k_pool, v_pool, token_indices, stages=encoded.num_received_stages)

    def upgrade(
        self,
        streams: Sequence[torch.Tensor],
        shape: KVShape,
        k_pools: Sequence[torch.Tensor],
        v_pools: Sequence[torch.Tensor],
        token_indices: torch.Tensor,
        layers: range | None = None,
    ) -> None:
        """Rewrite slots that hold anchor-only values with the full reconstruction.

        `streams` are all of the mode's streams; `layers`, the layers to
        rewrite (all by default), so an upgrade can be done a few layers at a
        time. The slots end up bit-identical to `write` with every stream (the
        values are recomputed from the codes, never incremented in place).
        """
        if self.spec is None or len(streams) != self.num_streams:
            raise ValueError("upgrade needs every stream of a quantized mode")
        for k_pool, v_pool, parts in self._layers(streams, shape, k_pools, v_pools, layers):
            scatter_upgrade(self._encoded(parts, shape), k_pool, v_pool, token_indices)

    def _layers(self, streams, shape, k_pools, v_pools, layers: range | None = None):
        """Per layer (of `layers`, default all): its pools and its slice of each stream, on the
        pools' device (none if no tokens)."""
        if len(k_pools) != len(v_pools):
            raise ValueError(f"{len(k_pools)} K pools but {len(v_pools)} V pools")
        if shape.num_tokens == 0:
            return
        bounds = self.layer_bounds(shape)
        for layer in range(len(k_pools)) if layers is None else layers:
            k_pool, v_pool = k_pools[layer], v_pools[layer]
            yield k_pool, v_pool, [s[b[layer] : b[layer + 1]].to(k_pool.device) for s, b in zip(streams, bounds)]

    def _encoded(self, parts: list[torch.Tensor], shape: KVShape) -> EncodedKV:
        """One layer's received parts as the codec's streams (a joined stream split back)."""
        if self.joined:
            parts = list(parts[0].split(self._codec_stream_bytes(shape)))
        return EncodedKV.from_streams(
            parts, self._spec(shape.first_token), shape.num_tokens, shape.kv_heads, shape.head_dim, shape.dtype
        )

    def _codec_stream_bytes(self, shape: KVShape) -> tuple[int, ...]:
        spec = self._spec(shape.first_token)
        return spec.stream_bytes(shape.num_tokens, shape.kv_heads, shape.head_dim, shape.dtype)

    def _spec(self, first_token: int) -> CodecSpec | None:
        """The codec of a segment starting at `first_token`: only the first one holds the sinks."""
        if self.spec is None or first_token == 0:
            return self.spec
        if first_token < self.spec.sink_tokens:
            raise ValueError(f"a segment may not start inside the {self.spec.sink_tokens} sink tokens ({first_token})")
        return replace(self.spec, sink_tokens=0)


def _typed(data: torch.Tensor, shape: KVShape, pool: torch.Tensor) -> torch.Tensor:
    values = data.to(pool.device).view(shape.dtype)
    return values.reshape(shape.num_tokens, shape.kv_heads, shape.head_dim).to(pool.dtype)


def to_host(data: torch.Tensor) -> torch.Tensor:
    """`data` on the CPU. From a CUDA GPU the copy goes into page-locked memory, which PyTorch
    caches: on an H200 copying 32 MiB into pageable memory took 26-31 ms (about 1.1 GB/s), into
    page-locked memory 0.64 ms."""
    if data.device.type != "cuda":
        return data.cpu()
    host = torch.empty(data.shape, dtype=data.dtype, pin_memory=True)
    host.copy_(data)
    return host

