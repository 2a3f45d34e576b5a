"""Signed control messages between Lynx prefill and decode managers.

They ride SGLang's own control sockets (`CommonKVManager.server_socket`). Each
message ends with a MAC over its other parts, keyed by the shared secret, so a
peer without the secret can neither register a decode rank, nor claim a
request's KV, nor fake a transfer status. A request's metadata carries a fresh
transfer nonce (the key of its manifest and frame MACs) and the decode rank's
data endpoint, so a message recorded earlier cannot steer a later transfer.
The messages are typed dataclasses; `lynx.transfer.messages` turns them into
SGLang's positional parts and back, checking every field.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

from lynx.heads import HeadShard
from lynx.transfer.frames import seal, unseal
from lynx.transfer.keys import NONCE_BYTES
from lynx.transfer.messages import Const, Decimal, Decimals, Flag, MessageError, Raw, Text, decode, encode, message
from lynx.transfer.mooncake.control import MooncakeEndpoint

REGISTER_TAG = b"None"  # SGLang's marker for a registration message
STATUS_TAG = b"LYNX_STATUS"
MOONCAKE_SCHEME = "mooncake://"
_ENDPOINT = re.compile(r"^tcp://(\[[0-9a-fA-F:.]+\]|[0-9.]+):(\d{1,5})$")


class ControlError(ValueError):
    """A control message that is malformed, unsigned, stale or not acceptable."""


def open_sealed(key: bytes, msg: list[bytes], what: str) -> list[bytes]:
    """The message parts without the MAC; ControlError if the MAC does not verify."""
    parts = unseal(key, msg)
    if parts is None:
        raise ControlError(
            f"rejected {what}: bad signature (a peer with a different --lynx-secret-file/"
            "LYNX_SECRET, or a corrupted message)"
        )
    return parts


def check_data_endpoint(endpoint: str, host: str) -> None:
    """Raise ControlError unless every address in `endpoint` is on `host` (the sender's own IP).

    `endpoint` is ``tcp://IP:PORT`` (ZeroMQ) or a ``mooncake://`` endpoint,
    whose engine session and control socket must both be on `host`.
    """
    if endpoint.startswith(MOONCAKE_SCHEME):
        try:
            parsed = MooncakeEndpoint.parse(endpoint)
        except ValueError as exc:
            raise ControlError(f"data endpoint: {exc}") from None
        _check_address(f"tcp://{parsed.session}", host, endpoint)
        _check_address(parsed.control, host, endpoint)
        return
    _check_address(endpoint, host, endpoint)


def _check_address(address: str, host: str, endpoint: str) -> None:
    match = _ENDPOINT.match(address)
    if match is None:
        raise ControlError(f"data endpoint {endpoint!r}: {address!r} is not tcp://IP:PORT")
    ip, port = match.group(1).strip("[]"), int(match.group(2))
    try:
        same = ipaddress.ip_address(ip) == ipaddress.ip_address(host)
    except ValueError:
        raise ControlError(f"data endpoint {endpoint!r} does not name an IP address") from None
    if not same or not 0 < port < 65536:
        raise ControlError(f"data endpoint {endpoint!r} is not on the sending decode rank's address {host}")


@message(
    Const(REGISTER_TAG), Text("ip"), Decimal("port"), Text("session_id"), Decimal("tp_rank"), Decimal("attn_tp_size"),
    Decimals("aux_item_lens"), Text("wire_version"), Decimal("issued_ns"), Decimals("heads", record=HeadShard),
)  # fmt: skip
@dataclass(frozen=True)
class DecodeRegistration:
    """A decode rank introducing itself to a prefill rank.

    ``heads`` says which KV heads the rank holds (its share under tensor
    parallelism), so the prefill rank sends it exactly those. ``issued_ns``
    orders registrations of one session: an older one (a replay) never
    replaces a newer one.
    """

    ip: str
    port: int
    session_id: str
    tp_rank: int
    attn_tp_size: int
    aux_item_lens: tuple[int, ...]
    wire_version: str
    issued_ns: int
    heads: HeadShard

    def to_parts(self) -> list[bytes]:
        return encode(self)

    @classmethod
    def from_parts(cls, parts: list[bytes]) -> DecodeRegistration:
        try:
            return decode(cls, parts)
        except MessageError as exc:
            raise ControlError(f"malformed decode registration (is the decode server's Lynx older?): {exc}") from None


@message(
    Decimal("room"), Decimal("dst_port"), Decimal("required_dst_info_num"), Decimal("decode_prefix_len"),
    Decimal("num_tokens"), Decimal("draft_window_ms"), Text("endpoint"), Text("session_id"), Flag("is_dummy"),
    Raw("nonce", NONCE_BYTES), Text("data_endpoint"),
)  # fmt: skip
@dataclass(frozen=True)
class RoomMetadata:
    """What a decode rank expects of one request's transfer (SGLang's TransferInfo).

    Attributes:
        room: the request's bootstrap room.
        endpoint, dst_port, session_id: the decode rank (its control address).
        required_dst_info_num: decode ranks that take part (SGLang's count).
        is_dummy: this rank receives nothing (SGLang's dummy rank).
        decode_prefix_len: prompt tokens the decode rank already holds (its
            radix cache); only the rest crosses the link.
        num_tokens: exactly how many tokens' KV the prefill must send.
        nonce: the transfer nonce (`lynx.transfer.keys`).
        data_endpoint: where to send the streams (on ``endpoint``'s address).
        draft_window_ms: how long the decode rank can draft on the anchor
            (`lynx.speculation.DraftWindow`): the prefill's sender has the
            residual leave within this of the anchor.
    """

    room: int
    endpoint: str
    dst_port: int
    session_id: str
    required_dst_info_num: int
    is_dummy: bool
    decode_prefix_len: int
    num_tokens: int
    nonce: bytes
    data_endpoint: str
    draft_window_ms: int = 0

    def to_parts(self) -> list[bytes]:
        return encode(self)

    @classmethod
    def from_parts(cls, parts: list[bytes]) -> RoomMetadata:
        try:
            return decode(cls, parts)
        except MessageError as exc:
            raise ControlError(f"malformed room metadata: {exc}") from None
