"""Build the configured transport (`--lynx-transport`) for a sending or a receiving rank.

The sides of the PD backend ask here for a `Transport` (prefill) or a
`Listener` (decode) and never name an implementation themselves.

* ``zmq``: ZeroMQ over TCP; CurveZMQ (encrypted, peers authenticated at the
  handshake) when a secret is set, unless `plaintext_data`.
* ``mooncake``: Mooncake's TransferEngine writes messages into a registered
  arena of the listener (TCP here, RDMA on clusters); its control plane is
  CurveZMQ, its data plane is never encrypted (frames stay MAC-checked).

Both are imported here whatever is configured: the Mooncake modules import the
optional ``mooncake`` package only when an engine is made
(`lynx.transfer.mooncake.engine`).
"""

from __future__ import annotations

from lynx.config import LynxConfig
from lynx.transfer.keys import curve_keys
from lynx.transfer.mooncake.listener import MooncakeListener
from lynx.transfer.mooncake.transport import MooncakeTransport
from lynx.transfer.transport import Listener, Transport
from lynx.transfer.zmq_transport import ZmqListener, ZmqTransport

FRAME_OVERHEAD = 4096  # a frame's header part and a manifest fit in this beside a chunk


def make_listener(config: LynxConfig, secret: bytes, host: str) -> Listener:
    """The decode rank's data listener, bound to `host`; frames up to `config.chunk_bytes`."""
    largest = config.chunk_bytes + FRAME_OVERHEAD
    if config.transport == "mooncake":
        return MooncakeListener(
            secret, host, protocol=config.mooncake_protocol, device=config.mooncake_device, slot_bytes=largest
        )
    curve = curve_keys(secret) if secret and not config.plaintext_data else None
    return ZmqListener(host=host, max_message_bytes=largest, curve=curve)


def make_transport(config: LynxConfig, secret: bytes, host: str) -> Transport:
    """The prefill rank's sending transport (advertising `host` where the transport needs to)."""
    if config.transport == "mooncake":
        return MooncakeTransport(
            secret,
            host=host,
            protocol=config.mooncake_protocol,
            device=config.mooncake_device,
            staging_slot_bytes=config.chunk_bytes + FRAME_OVERHEAD,
        )
    return ZmqTransport(curve=curve_keys(secret) if secret and not config.plaintext_data else None)
