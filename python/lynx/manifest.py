"""The per-request announcement a sender makes before the request's streams.

It tells the receiver how big each stream is and what it holds, so the
receiver can preallocate exact buffers, reject frames outside them, and refuse
a request whose sender runs a different mode or codec than its own.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

import torch

from lynx.kvwire import KVShape, WireFormat

MANIFEST_TAG = b"LYNX_MANIFEST"
MANIFEST_VERSION = 1
_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


@dataclass(frozen=True)
class Manifest:
    """What one request's transfer carries.

    Attributes:
        room: the request's bootstrap room (transfer id).
        mode, preset: the sender's `--lynx-mode` and `--lynx-preset`.
        num_layers, num_tokens, kv_heads, head_dim, dtype: the KV shape.
        stream_sizes: bytes of each KV stream, anchor first.
        aux_size: bytes of the request metadata (first token etc.).
    """

    room: int
    mode: str
    preset: str
    num_layers: int
    num_tokens: int
    kv_heads: int
    head_dim: int
    dtype: str
    stream_sizes: tuple[int, ...]
    aux_size: int
    version: int = MANIFEST_VERSION

    @property
    def shape(self) -> KVShape:
        return KVShape(self.num_layers, self.num_tokens, self.kv_heads, self.head_dim, _DTYPES[self.dtype])

    def to_bytes(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> Manifest:
        try:
            fields = json.loads(data)
            fields["stream_sizes"] = tuple(fields["stream_sizes"])
            manifest = cls(**fields)
        except (ValueError, TypeError, KeyError) as exc:
            raise ValueError(f"malformed transfer manifest: {exc}") from None
        if manifest.version != MANIFEST_VERSION:
            raise ValueError(f"unsupported manifest version {manifest.version}")
        if manifest.dtype not in _DTYPES:
            raise ValueError(f"unsupported KV dtype {manifest.dtype!r}")
        return manifest

    def mismatch(self, wire: WireFormat, expected: KVShape, preset: str) -> str | None:
        """Why this manifest cannot be received into `expected` with `wire`, or None."""
        if self.mode != wire.mode or (wire.mode == "lynx" and self.preset != preset):
            return (
                f"prefill sends --lynx-mode {self.mode} --lynx-preset {self.preset} but this "
                f"decode server runs --lynx-mode {wire.mode} --lynx-preset {preset}; "
                "start both with the same Lynx options"
            )
        mine = (expected.num_layers, expected.kv_heads, expected.head_dim, expected.dtype)
        theirs = (self.num_layers, self.kv_heads, self.head_dim, _DTYPES[self.dtype])
        if mine != theirs:
            return f"KV layout differs: prefill (layers, heads, head_dim, dtype) {theirs}, decode {mine}"
        if self.num_tokens > expected.num_tokens:
            return f"{self.num_tokens} tokens announced, {expected.num_tokens} slots reserved"
        if self.stream_sizes != wire.stream_sizes(self.shape):
            return f"stream sizes {self.stream_sizes} do not match {self.mode} for this shape"
        return None


def dtype_name(dtype: torch.dtype) -> str:
    for name, value in _DTYPES.items():
        if value == dtype:
            return name
    raise ValueError(f"unsupported KV dtype {dtype}")
