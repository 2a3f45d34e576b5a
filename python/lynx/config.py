"""Lynx's user-facing options: one table drives the CLI, the config and the docs."""

from __future__ import annotations

from dataclasses import dataclass, fields

from lynx.codec import CodecSpec

MODES = ("bf16", "int8", "int4", "lynx")


@dataclass(frozen=True)
class LynxConfig:
    """Options of a Lynx-enabled server (`--lynx-*` on the command line).

    Attributes:
        mode: what crosses the prefill→decode link. ``bf16``: the KV as is, one
            stream. ``int8``: 8-bit KV, one stream, decode waits for all of it.
            ``int4``: the 4-bit anchor only (lossy). ``lynx``: anchor first,
            residual later.
        preset: codec preset (bit widths of the stages) used by ``lynx`` mode.
    """

    mode: str = "lynx"
    preset: str = "int8"

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"--lynx-mode must be one of {', '.join(MODES)}; got {self.mode!r}")
        if self.preset not in CodecSpec.preset_names():
            raise ValueError(
                f"--lynx-preset must be one of {', '.join(CodecSpec.preset_names())}; "
                f"got {self.preset!r}"
            )

    @property
    def codec_spec(self) -> CodecSpec:
        return CodecSpec.preset(self.preset)


@dataclass(frozen=True)
class OptionDoc:
    """One `--lynx-*` option as the CLI and README present it."""

    field: str
    flag: str
    metavar: str
    help: str
    choices: tuple[str, ...] | None = None

    @property
    def default(self):
        return next(f.default for f in fields(LynxConfig) if f.name == self.field)


def options() -> tuple[OptionDoc, ...]:
    """Every `--lynx-*` option, in the order `--help` lists them."""
    return (
        OptionDoc(
            "mode",
            "--lynx-mode",
            "MODE",
            "What crosses the prefill->decode link: bf16 (unquantized), int8 (one "
            "8-bit stream), int4 (anchor only, lossy) or lynx (anchor first, "
            "residual later, exact output).",
            MODES,
        ),
        OptionDoc(
            "preset",
            "--lynx-preset",
            "NAME",
            "Codec preset: bit widths of the anchor and residual stages.",
            CodecSpec.preset_names(),
        ),
    )
