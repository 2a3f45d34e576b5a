"""`--lynx` and the `--lynx-*` options on SGLang's own argument parser, and the config they make.

`ServerArgs` is a msgspec struct whose fields a plugin cannot extend, so the
parsed options travel as the bookkeeping attribute `server_args._lynx` (a
`LynxConfig`), which SGLang pickles into every scheduler process.
"""

from __future__ import annotations

import argparse
import sys

from lynx.config import LynxConfig
from lynx.options import options
from lynx_patches import targets
from lynx_patches.selfcheck import Hook

BACKEND = "lynx"
STOCK_DEFAULT_BACKEND = "mooncake"


def add_options(parser: argparse.ArgumentParser, enable: type[argparse.Action]) -> None:
    """Add the Lynx option group to SGLang's parser: `--lynx` (parsed by the action `enable`) and
    every `--lynx-*` option."""
    group = parser.add_argument_group("Lynx", "Anchor/residual KV transfer (lynx_patches).")
    group.add_argument("--lynx", action=enable, help="Enable Lynx on this server.")
    for opt in options():
        if opt.is_switch:
            group.add_argument(opt.flag, dest=f"lynx_{opt.field}", action="store_true", help=opt.help)
            continue
        group.add_argument(
            opt.flag,
            dest=f"lynx_{opt.field}",
            metavar=opt.metavar,
            type=opt.type,
            choices=opt.choices,
            default=opt.default,
            help=f"{opt.help} (default: %(default)s)",
        )


def _fail(message: str):
    print(f"sglang serve: error: {message}", file=sys.stderr)
    raise SystemExit(2)


def from_cli_args(original, cls, args: argparse.Namespace):
    """AROUND `ServerArgs.from_cli_args`: attach `_lynx` when `--lynx` was given."""
    server_args = original(cls, args)
    if not getattr(args, "lynx", False):
        return server_args
    try:
        config = LynxConfig(**{o.field: getattr(args, f"lynx_{o.field}") for o in options()})
    except ValueError as exc:
        _fail(str(exc))
    if server_args.disaggregation_mode in ("prefill", "decode"):
        _prepare_disaggregation(server_args, config)
    elif config.loopback:
        # The radix cache would hand a round-tripped prompt KV to later requests.
        server_args.disable_radix_cache = True
    server_args._lynx = config
    return server_args


def _prepare_disaggregation(server_args, config: LynxConfig) -> None:
    """Select the lynx transfer backend and refuse what it cannot serve."""
    backend = server_args.disaggregation_transfer_backend
    if backend not in (BACKEND, STOCK_DEFAULT_BACKEND):
        _fail(
            f"--lynx transfers KV with its own backend; drop "
            f"--disaggregation-transfer-backend {backend}"
        )
    if config.loopback:
        _fail("--lynx-loopback is for a non-disaggregated server; drop it or --disaggregation-mode")
    if server_args.pp_size > 1:
        _fail(
            "the lynx transfer backend serves prefill/decode pairs with --pp-size 1 (each pipeline stage "
            "would have to send its own layers' KV)"
        )
    server_args.disaggregation_transfer_backend = BACKEND
    if config.speculates and server_args.disaggregation_mode == "decode":
        # Residual upgrades and verify passes run between forward passes; the
        # overlap schedule would have the next forward in flight.
        server_args.disable_overlap_schedule = True
    try:
        config.load_secret()
    except ValueError as exc:
        _fail(str(exc))


# The option group itself is added by `lynx_patches.hooks.add_cli_args`, whose `--lynx` checks every hook.
HOOKS = (Hook(targets.SERVER_ARGS_FROM_CLI_ARGS, from_cli_args, "AROUND"),)
