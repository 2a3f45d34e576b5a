"""Lynx's user-facing options: one table drives the CLI, the config and the docs."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

from lynx.codec import CodecSpec
from lynx.kvwire import WireFormat
from lynx.transfer.keys import check_secret

MODES = ("bf16", "int8", "int4", "lynx", "auto")
TRANSPORTS = ("zmq", "mooncake")
MOONCAKE_PROTOCOLS = ("tcp", "rdma")
RESIDUAL_PRIORITIES = ("deadline", "finish", "strict")
SECRET_ENV = "LYNX_SECRET"
MIN_CHUNK_BYTES = 4 << 10
MAX_CHUNK_BYTES = 64 << 20
MAX_SPECULATIVE_TOKENS = 1024


@dataclass(frozen=True)
class LynxConfig:
    """Options of a Lynx-enabled server (`--lynx-*` on the command line).

    Attributes:
        mode: what crosses the prefill→decode link (see `lynx.kvwire`).
        preset: codec preset (bit widths of the stages) used by ``lynx`` mode.
        link_gbps: emulated link rate at the sender in Gbit/s; 0 = unpaced.
        chunk_bytes: largest payload of one frame; bounds how long a residual
            chunk can hold up an anchor on the link.
        transfer_timeout: seconds a decode server waits without progress on a
            request's KV (counted from its manifest's arrival, with the first
            segment, then from its last accepted frame) before failing it.
        secret_file: file holding the shared secret that authenticates peers
            (else the `LYNX_SECRET` environment variable).
        insecure: allow disaggregated serving without a secret (local tests).
        plaintext_data: send KV without CurveZMQ encryption; frames stay
            MAC-authenticated (for trusted networks where encryption costs
            more than the link).
        transport: what moves the frames: ``zmq`` (ZeroMQ over TCP) or
            ``mooncake`` (Mooncake's TransferEngine).
        mooncake_protocol, mooncake_device: the Mooncake engine's protocol
            (``tcp``, or ``rdma`` on clusters) and RDMA devices.
        loopback: on a non-disaggregated server, round-trip each prompt's KV
            through the mode's wire format after prefill (accuracy of a mode
            without a decode server).
        max_speculative_tokens: ``lynx`` mode, decode side: tokens a request
            may generate on the anchor before it waits for its residual.
        segment_tokens: prefill side: a prompt's KV is encoded and sent in
            segments of this many tokens, each as soon as the (chunked)
            prefill has computed it; 0 sends it whole after the last chunk.
        residual_priority: prefill side, ``lynx`` mode: ``deadline`` (a
            request's residual is due one draft window after its anchor left,
            the time its decode server says it can draft on the anchor; newer
            anchors go first only while every queued residual can still make
            its deadline), ``finish`` (on a paced link, due when a
            first-come-first-served sender would have sent the request's last
            byte, plus half its draft window) or ``strict`` (every anchor
            before any residual).
    """

    mode: str = "lynx"
    preset: str = "int8"
    link_gbps: float = 0.0
    chunk_bytes: int = 1 << 20
    transfer_timeout: float = 60.0
    secret_file: str | None = None
    insecure: bool = False
    plaintext_data: bool = False
    transport: str = "zmq"
    mooncake_protocol: str = "tcp"
    mooncake_device: str = ""
    loopback: bool = False
    max_speculative_tokens: int = 16
    segment_tokens: int = 512
    residual_priority: str = "finish"

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"--lynx-mode must be one of {', '.join(MODES)}; got {self.mode!r}")
        if self.mode == "auto" and self.preset != "int8":
            raise ValueError(
                "--lynx-mode auto sends each request as int8's one stream or lynx's two streams of the int8 "
                f"preset, so it takes --lynx-preset int8; got {self.preset!r}"
            )
        try:
            CodecSpec.preset(self.preset)
        except ValueError as exc:
            raise ValueError(f"--lynx-preset: {exc}") from None
        if not (math.isfinite(self.link_gbps) and self.link_gbps >= 0):
            raise ValueError(f"--lynx-link-gbps must be >= 0 (0 = unpaced); got {self.link_gbps}")
        if not MIN_CHUNK_BYTES <= self.chunk_bytes <= MAX_CHUNK_BYTES:
            raise ValueError(
                f"--lynx-chunk-bytes must be in [{MIN_CHUNK_BYTES}, {MAX_CHUNK_BYTES}]; "
                f"got {self.chunk_bytes}"
            )
        if not 0 <= self.max_speculative_tokens <= MAX_SPECULATIVE_TOKENS:
            raise ValueError(
                f"--lynx-max-speculative-tokens must be in [0, {MAX_SPECULATIVE_TOKENS}]; "
                f"got {self.max_speculative_tokens}"
            )
        if self.transport not in TRANSPORTS:
            raise ValueError(f"--lynx-transport must be one of {', '.join(TRANSPORTS)}; got {self.transport!r}")
        if self.mooncake_protocol not in MOONCAKE_PROTOCOLS:
            raise ValueError(
                f"--lynx-mooncake-protocol must be one of {', '.join(MOONCAKE_PROTOCOLS)}; got {self.mooncake_protocol!r}"
            )
        try:
            self.wire.segments(0, self.segment_tokens)
        except ValueError as exc:
            raise ValueError(f"--lynx-segment-tokens: {exc}") from None
        if self.residual_priority not in RESIDUAL_PRIORITIES:
            raise ValueError(
                f"--lynx-residual-priority must be one of {', '.join(RESIDUAL_PRIORITIES)}; got {self.residual_priority!r}"
            )
        if not (math.isfinite(self.transfer_timeout) and self.transfer_timeout > 0):
            raise ValueError(f"--lynx-transfer-timeout must be > 0 seconds; got {self.transfer_timeout}")

    @property
    def residual_window_s(self) -> float | None:
        """The sender's residual window before a decode rank names one (0: right after the anchor),
        or None for strict anchor priority."""
        return None if self.residual_priority == "strict" else 0.0

    @property
    def wire(self) -> WireFormat:
        """The wire format of this server's requests (``auto``: lynx's; see `wires`)."""
        return WireFormat.for_mode("lynx" if self.mode == "auto" else self.mode, self.preset)

    @property
    def wires(self) -> dict[str, WireFormat]:
        """Every wire format a request of this server may be sent in, by the mode a manifest names."""
        if self.mode == "auto":
            return {m: WireFormat.for_mode(m, self.preset) for m in ("int8", "lynx")}
        return {self.mode: self.wire}

    @property
    def speculates(self) -> bool:
        """Whether requests may decode on the anchor here (``lynx`` and ``auto``)."""
        return self.mode in ("lynx", "auto")

    def load_secret(self) -> bytes:
        """The shared secret (b"" when insecure and none is configured).

        Raises:
            ValueError: no secret is configured and `insecure` is off, or the
                secret file is missing or empty.
        """
        if self.secret_file is not None:
            try:
                secret = Path(self.secret_file).read_bytes().strip()
            except OSError as exc:
                raise ValueError(f"--lynx-secret-file {self.secret_file}: {exc.strerror}") from None
            if not secret:
                raise ValueError(f"--lynx-secret-file {self.secret_file} is empty")
            _check_length(secret, f"--lynx-secret-file {self.secret_file}")
            return secret
        secret = os.environ.get(SECRET_ENV, "").encode()
        if secret:
            _check_length(secret, f"${SECRET_ENV}")
            return secret
        if self.insecure:
            return secret
        raise ValueError(
            "disaggregated Lynx servers authenticate each other with a shared secret: "
            f"pass --lynx-secret-file PATH or set {SECRET_ENV} (the same on prefill and "
            "decode), or --lynx-insecure for local experiments"
        )


def _check_length(secret: bytes, where: str) -> None:
    try:
        check_secret(secret)
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from None
