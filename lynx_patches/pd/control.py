"""Signed control messages between Lynx prefill and decode managers.

They ride SGLang's own control sockets (`CommonKVManager.server_socket`). Each
message ends with a MAC over its other parts, keyed by the shared secret, so a
peer without the secret can neither register a decode endpoint, nor claim a
request's KV, nor fake a transfer status.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lynx.transfer.frames import sign, verify

REGISTER_TAG = b"None"  # SGLang's marker for a registration message
STATUS_TAG = b"LYNX_STATUS"


class ControlError(ValueError):
    """A control message that is malformed or not signed with the shared secret."""


def seal(key: bytes, parts: list[bytes]) -> list[bytes]:
    return [*parts, sign(key, *parts)]


def open_sealed(key: bytes, msg: list[bytes], what: str) -> list[bytes]:
    """The message parts without the MAC; ControlError if the MAC does not verify."""
    if len(msg) < 2 or not verify(key, msg[-1], *msg[:-1]):
        raise ControlError(
            f"rejected {what}: bad signature (a peer with a different --lynx-secret-file/"
            "LYNX_SECRET, or a corrupted message)"
        )
    return msg[:-1]


@dataclass(frozen=True)
class DecodeRegistration:
    """A decode rank introducing itself to a prefill rank."""

    ip: str
    port: int
    session_id: str
    data_endpoint: str
    tp_rank: int
    attn_tp_size: int
    aux_item_lens: tuple[int, ...]

    def to_parts(self) -> list[bytes]:
        return [
            REGISTER_TAG,
            self.ip.encode(),
            str(self.port).encode(),
            self.session_id.encode(),
            self.data_endpoint.encode(),
            str(self.tp_rank).encode(),
            str(self.attn_tp_size).encode(),
            np.asarray(self.aux_item_lens, dtype="<u8").tobytes(),
        ]

    @classmethod
    def from_parts(cls, parts: list[bytes]) -> DecodeRegistration:
        try:
            return cls(
                parts[1].decode(),
                int(parts[2]),
                parts[3].decode(),
                parts[4].decode(),
                int(parts[5]),
                int(parts[6]),
                tuple(int(x) for x in np.frombuffer(parts[7], dtype="<u8")),
            )
        except (IndexError, ValueError, UnicodeDecodeError) as exc:
            raise ControlError(f"malformed decode registration: {exc}") from None


@dataclass(frozen=True)
class RoomMetadata:
    """Where one request's KV goes on a decode rank (SGLang's TransferInfo)."""

    room: int
    endpoint: str
    dst_port: int
    session_id: str
    dst_pages: np.ndarray
    dst_aux_index: int
    required_dst_info_num: int
    is_dummy: bool
    decode_prefix_len: int = 0  # prompt tokens the decode rank already holds (its radix cache)

    def to_parts(self) -> list[bytes]:
        return [
            str(self.room).encode(),
            self.endpoint.encode(),
            str(self.dst_port).encode(),
            self.session_id.encode(),
            np.asarray(self.dst_pages, dtype="<i4").tobytes(),
            str(self.dst_aux_index).encode(),
            str(self.required_dst_info_num).encode(),
            b"1" if self.is_dummy else b"0",
            str(self.decode_prefix_len).encode(),
        ]

    @classmethod
    def from_parts(cls, parts: list[bytes]) -> RoomMetadata:
        try:
            return cls(
                int(parts[0]),
                parts[1].decode(),
                int(parts[2]),
                parts[3].decode(),
                np.frombuffer(parts[4], dtype="<i4").astype(np.int64),
                int(parts[5]),
                int(parts[6]),
                parts[7] == b"1",
                int(parts[8]),
            )
        except (IndexError, ValueError, UnicodeDecodeError) as exc:
            raise ControlError(f"malformed room metadata: {exc}") from None


def page_slots(pages: np.ndarray, page_size: int, num_tokens: int) -> np.ndarray:
    """Token slots of the first `num_tokens` tokens stored in `pages` (int64)."""
    pages = np.asarray(pages, dtype=np.int64)
    if num_tokens > len(pages) * page_size:
        raise ValueError(f"{num_tokens} tokens do not fit in {len(pages)} pages of {page_size}")
    slots = (pages[:, None] * page_size + np.arange(page_size)[None, :]).reshape(-1)
    return slots[:num_tokens]
