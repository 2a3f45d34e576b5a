"""Prioritized, authenticated byte-stream transfer from prefill to decode servers.

``frames`` is the versioned wire header and its MAC; ``policy`` decides what
goes next and how streams are chunked (pure); ``pacer`` emulates a link;
``transport`` is the interface that moves messages and ``zmq_transport`` its
ZeroMQ/TCP implementation; ``sender`` is the one-thread priority scheduler
(frames signed by ``chunking``, queued in ``send_queue``, peers given up by
``stalls``); ``reassembly`` rebuilds a request's streams and reports milestones.
Engine-agnostic: imports neither SGLang nor Triton.
"""

from lynx.transfer.frames import (
    AUX_STREAM,
    FRAME_VERSION,
    DuplicateFrame,
    FrameAuthError,
    FrameError,
    FrameHeader,
    MalformedFrame,
    OversizedFrame,
    UnsupportedVersion,
    decode_frame,
    encode_frame,
    peek_room,
    priority_of,
    sign,
    verify,
)
from lynx.transfer.pacer import TokenBucket, Unpaced, make_pacer
from lynx.transfer.reassembly import RequestAssembly
from lynx.transfer.send_queue import SenderStats
from lynx.transfer.sender import PrioritySender
from lynx.transfer.transport import Listener, Transport, TransportError
from lynx.transfer.zmq_transport import ZmqListener, ZmqTransport

__all__ = [
    "AUX_STREAM",
    "FRAME_VERSION",
    "DuplicateFrame",
    "FrameAuthError",
    "FrameError",
    "FrameHeader",
    "Listener",
    "MalformedFrame",
    "OversizedFrame",
    "PrioritySender",
    "RequestAssembly",
    "SenderStats",
    "TokenBucket",
    "Transport",
    "TransportError",
    "Unpaced",
    "UnsupportedVersion",
    "ZmqListener",
    "ZmqTransport",
    "decode_frame",
    "encode_frame",
    "make_pacer",
    "peek_room",
    "priority_of",
    "sign",
    "verify",
]
