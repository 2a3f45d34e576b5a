"""The `--lynx-*` options as the CLI and README present them: flag, metavar, help, type, choices, default."""

from __future__ import annotations

from dataclasses import dataclass, fields

from lynx.codec import CodecSpec
from lynx.config import LynxConfig, MODES, TRANSPORTS, MOONCAKE_PROTOCOLS, RESIDUAL_PRIORITIES, SECRET_ENV, MIN_CHUNK_BYTES, MAX_CHUNK_BYTES


@dataclass(frozen=True)
class OptionDoc:
    """One `--lynx-*` option as the CLI and README present it."""

    field: str
    metavar: str | None
    help: str
    type: type = str
    choices: tuple[str, ...] | None = None

    @property
    def flag(self) -> str:
        return "--lynx-" + self.field.replace("_", "-")

    @property
    def default(self):
        return next(f.default for f in fields(LynxConfig) if f.name == self.field)

    @property
    def is_switch(self) -> bool:
        return self.type is bool


def options() -> tuple[OptionDoc, ...]:
    """Every `--lynx-*` option, in the order `--help` lists them."""
    return (
        OptionDoc(
            "mode",
            "MODE",
            "What crosses the prefill->decode link: bf16 (unquantized), int8 (one "
            "8-bit stream), int4 (anchor only, lossy), lynx (anchor first, "
            "residual later) or auto (per request int8 where the link keeps up with the prefill, else lynx).",
            choices=MODES,
        ),
        OptionDoc(
            "preset",
            "NAME",
            f"Codec preset of lynx mode: {', '.join(CodecSpec.preset_names())}, or stage "
            "bit widths anchor first, e.g. 2+6 or 2+2+4.",
        ),
        OptionDoc(
            "max_speculative_tokens",
            "N",
            "lynx mode, decode server: tokens a request may generate on the anchor "
            "before it waits for its residual (0 = no speculation).",
            type=int,
        ),
        OptionDoc(
            "segment_tokens",
            "N",
            "Prefill server: encode and send a prompt's KV in segments of N tokens, each as soon "
            "as the chunked prefill has computed it (a multiple of 64; 0 = whole, after the last chunk).",
            type=int,
        ),
        OptionDoc(
            "residual_priority",
            "RULE",
            "Prefill server, lynx mode: deadline (a request's residual is due one draft window after its "
            "anchor left, as its decode server measures it; newer anchors go first only while every queued "
            "residual can still make it), finish (on a paced link, due when a first-come-first-served sender "
            "would have sent the request's last byte, plus half its draft window) or strict (every anchor "
            "before any residual).",
            choices=RESIDUAL_PRIORITIES,
        ),
        OptionDoc(
            "link_gbps",
            "RATE",
            "Emulated link rate at the prefill sender in Gbit/s (token bucket); 0 = unpaced.",
            type=float,
        ),
        OptionDoc(
            "chunk_bytes",
            "N",
            f"Largest frame payload in bytes ({MIN_CHUNK_BYTES}..{MAX_CHUNK_BYTES}).",
            type=int,
        ),
        OptionDoc(
            "transfer_timeout",
            "SECONDS",
            "Decode side: fail a request whose KV makes no progress for this long, counted "
            "from the prefill's announcement of the transfer, then from the last byte received.",
            type=float,
        ),
        OptionDoc(
            "secret_file",
            "PATH",
            f"File with the shared secret that authenticates prefill and decode peers "
            f"(else ${SECRET_ENV}).",
        ),
        OptionDoc(
            "insecure",
            None,
            "Allow disaggregated serving without a shared secret (local experiments only).",
            type=bool,
        ),
        OptionDoc(
            "plaintext_data",
            None,
            "Send KV without CurveZMQ encryption (frames stay MAC-authenticated); for trusted "
            "networks where encryption costs more than the link.",
            type=bool,
        ),
        OptionDoc(
            "transport",
            "NAME",
            "What moves the KV: zmq (ZeroMQ over TCP, encrypted with a secret) or mooncake "
            "(Mooncake's TransferEngine: TCP here, RDMA on clusters; never encrypted).",
            choices=TRANSPORTS,
        ),
        OptionDoc(
            "mooncake_protocol",
            "PROTOCOL",
            "--lynx-transport mooncake: the engine's protocol, tcp or rdma.",
            choices=MOONCAKE_PROTOCOLS,
        ),
        OptionDoc(
            "mooncake_device",
            "NAMES",
            "--lynx-transport mooncake with rdma: the RDMA devices (e.g. mlx5_0,mlx5_1).",
        ),
        OptionDoc(
            "loopback",
            None,
            "Non-disaggregated server only: after prefill, round-trip each prompt's KV "
            "through the --lynx-mode wire format, as if it had crossed the link.",
            type=bool,
        ),
    )
