"""The per-request announcement a sender makes before the request's streams.

It tells the receiver how big each stream is and what it holds, so the
receiver can preallocate exact buffers, reject frames outside them, and refuse
a request whose sender runs a different mode, codec or wire version than its
own. On the wire it is an `Envelope`, ``[MANIFEST_TAG, room (u64, big-endian), body]``, and its MAC:
the room is readable without parsing the body, and the MAC is keyed with the
transfer's own key (`lynx.transfer.keys.transfer_key`), so a manifest recorded
from another transfer never verifies.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from lynx.codec import FORMAT_VERSION
from lynx.kvwire import KVShape, WireFormat
from lynx.transfer import frames
from lynx.transfer.alive import ALIVE_VERSION
from lynx.transfer.messages import Body, Const, Json, MessageError, Packed, decode, encode, message

MANIFEST_TAG = b"LYNX_MANIFEST"
MANIFEST_VERSION = 5
# The decode rank's per-request metadata (`lynx.pd.control.RoomMetadata`); 2 added its draft window.
METADATA_VERSION = 2
MAX_MANIFEST_BYTES = 4096
MAX_MANIFEST_DEPTH = 2  # an object whose one list (stream_sizes) holds numbers
# An envelope names its room whatever its body's size (a body over MAX_MANIFEST_BYTES is then refused
# as unauthenticatable); a bound all the same, as on every part the codec reads.
MAX_ENVELOPE_BYTES = 1 << 20
_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
_INT_FIELDS = (
    "room", "num_layers", "num_tokens", "kv_heads", "head_dim", "aux_size", "segment_tokens", "first_head",
    "version", "format_version",
)  # fmt: skip


class ManifestError(ValueError):
    """A manifest that is malformed, unauthenticated or for another transfer."""


class ManifestAuthError(ManifestError):
    """The manifest cannot be authenticated: its MAC does not verify (another secret, or recorded
    from another transfer), or it is too large to be checked at all. Anyone may have sent it."""


def wire_version() -> str:
    """What a peer must speak to exchange KV with this one (named in refusals)."""
    return (f"manifest v{MANIFEST_VERSION}, codec format v{FORMAT_VERSION}, alive v{ALIVE_VERSION}, "
            f"metadata v{METADATA_VERSION}")  # fmt: skip


@message(Json(MAX_MANIFEST_BYTES, MAX_MANIFEST_DEPTH))
@dataclass(frozen=True)
class Manifest:
    """What one request's transfer carries.

    Attributes:
        room: the request's bootstrap room (transfer id).
        mode, preset: the sender's `--lynx-mode` and `--lynx-preset`.
        num_layers, num_tokens, kv_heads, head_dim, dtype: the KV shape.
        stream_sizes: bytes of each KV stream, anchor first, over all segments.
        aux_size: bytes of the request metadata (first token etc.).
        segment_tokens: the tokens travel in segments of this many tokens
            (`lynx.kvwire.WireFormat.segments`); 0 = one segment.
        first_head: the streams carry the `kv_heads` KV heads from this one
            (tensor parallelism: a rank's share, `lynx.heads`).
        version, format_version: the manifest's and the codec's wire versions.
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
    segment_tokens: int = 0
    first_head: int = 0
    version: int = MANIFEST_VERSION
    format_version: int = FORMAT_VERSION

    def __post_init__(self) -> None:
        for name in _INT_FIELDS:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ManifestError(f"manifest field {name} must be a non-negative int, got {value!r}")
        for name in ("mode", "preset", "dtype"):
            if not isinstance(getattr(self, name), str):
                raise ManifestError(f"manifest field {name} must be a string, got {getattr(self, name)!r}")
        sizes = self.stream_sizes
        if not isinstance(sizes, (tuple, list)) or not sizes:
            raise ManifestError(f"manifest stream_sizes must be a non-empty list, got {sizes!r}")
        if any(not isinstance(s, int) or isinstance(s, bool) or s < 0 for s in sizes):
            raise ManifestError(f"manifest stream_sizes must be non-negative ints, got {sizes!r}")
        object.__setattr__(self, "stream_sizes", tuple(sizes))
        if self.dtype not in _DTYPES:
            raise ManifestError(f"unsupported KV dtype {self.dtype!r}")

    @property
    def shape(self) -> KVShape:
        return KVShape(self.num_layers, self.num_tokens, self.kv_heads, self.head_dim, _DTYPES[self.dtype])

    def to_bytes(self) -> bytes:
        return encode(self)[0]

    @classmethod
    def from_bytes(cls, data: bytes) -> Manifest:
        """Parse a body; ManifestError names what is wrong (types included). A body over
        `MAX_MANIFEST_BYTES`, or nested deeper than `MAX_MANIFEST_DEPTH`, is refused before parsing."""
        try:
            return decode(cls, [data])
        except MessageError as exc:
            raise ManifestError(f"malformed transfer manifest: {exc}") from None

    def seal(self, key: bytes) -> list[bytes]:
        """The wire message, MAC'd with the transfer's key."""
        return frames.seal(key, encode(Envelope(self.room, self.to_bytes())))

    def mismatch(self, wire: WireFormat, expected: KVShape, preset: str) -> str | None:
        """Why this manifest cannot be received into `expected` with `wire`, or None.

        `expected.num_tokens` is the exact number of tokens the receiver reserved,
        `expected.kv_heads` the heads it takes from this sender.
        """
        if (self.version, self.format_version) != (MANIFEST_VERSION, FORMAT_VERSION):
            return (
                f"the prefill server speaks manifest v{self.version}, codec format v{self.format_version}; "
                f"this decode server {wire_version()}: run the same Lynx version on both"
            )
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
        if self.num_tokens != expected.num_tokens:
            return f"{self.num_tokens} tokens announced, {expected.num_tokens} slots reserved"
        try:
            segments = self.segment_sizes(wire)
        except ValueError as exc:
            return f"bad segmentation: {exc}"
        if self.stream_sizes != tuple(map(sum, zip(*segments))):
            return f"stream sizes {self.stream_sizes} do not match {self.mode} for this shape"
        return None

    def segment_sizes(self, wire: WireFormat) -> list[tuple[int, ...]]:
        """Per segment, the byte size of each of its streams."""
        return [wire.stream_sizes(part) for part in wire.segment_shapes(self.shape, self.segment_tokens)]

    def frame_count(self, wire: WireFormat, chunk_bytes: int) -> int:
        """The frames this transfer takes at `chunk_bytes` per frame (an empty stream still takes one)."""
        sizes = [size for segment in self.segment_sizes(wire) for size in segment] + [self.aux_size]
        return sum(max(1, -(-size // chunk_bytes)) for size in sizes)


@message(Const(MANIFEST_TAG), Packed("Q", "room"), Body("body", MAX_ENVELOPE_BYTES))
@dataclass(frozen=True)
class Envelope:
    """A manifest on the wire before its MAC: the room it is for, readable without parsing the body."""

    room: int
    body: bytes


def manifest_room(parts: list[bytes]) -> int | None:
    """The room a manifest message names, unauthenticated; None if it is not one."""
    envelope = frames.peek(Envelope, parts)
    return None if envelope is None else envelope.room


def open_manifest(parts: list[bytes], key: bytes) -> Manifest:
    """Verify and parse a manifest message with its transfer's key.

    Raises:
        ManifestError: not a manifest, too large, bad MAC, or malformed body.
    """
    envelope = frames.peek(Envelope, parts)
    if envelope is None:
        raise ManifestError("not a manifest message")
    room = envelope.room
    if len(envelope.body) > MAX_MANIFEST_BYTES:
        raise ManifestAuthError(f"manifest of {len(envelope.body)} bytes exceeds {MAX_MANIFEST_BYTES}")
    if frames.unseal(key, parts) is None:
        raise ManifestAuthError(
            f"manifest for room {room} has a bad MAC (another secret, or recorded from another transfer)"
        )
    manifest = Manifest.from_bytes(envelope.body)
    if manifest.room != room:
        raise ManifestError(f"manifest body names room {manifest.room}, its envelope room {room}")
    return manifest


def dtype_name(dtype: torch.dtype) -> str:
    for name, value in _DTYPES.items():
        if value == dtype:
            return name
    raise ValueError(f"unsupported KV dtype {dtype}")
