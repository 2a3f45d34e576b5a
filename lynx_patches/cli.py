"""`--lynx` and the `--lynx-*` options on SGLang's own argument parser.

`ServerArgs` is a msgspec struct whose fields a plugin cannot extend, so the
parsed options travel as the bookkeeping attribute `server_args._lynx` (a
`LynxConfig`), which SGLang pickles into every scheduler process.
"""

from __future__ import annotations

import argparse

from lynx.config import LynxConfig, options
from lynx_patches import targets
from lynx_patches.selfcheck import Hook, LynxHookError


class _EnableLynx(argparse.Action):
    """`--lynx`: turn Lynx on, after proving that its hooks are live."""

    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest, nargs=0, default=False, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        from lynx_patches.hooks import verify_hooks

        try:
            verify_hooks()
        except LynxHookError as exc:
            parser.error(str(exc))
        setattr(namespace, self.dest, True)


def add_cli_args(result, parser: argparse.ArgumentParser):
    """AFTER `ServerArgs.add_cli_args`: add the Lynx option group."""
    group = parser.add_argument_group("Lynx", "Anchor/residual KV transfer (lynx_patches).")
    group.add_argument("--lynx", action=_EnableLynx, help="Enable Lynx on this server.")
    for opt in options():
        group.add_argument(
            opt.flag,
            dest=f"lynx_{opt.field}",
            metavar=opt.metavar,
            choices=opt.choices,
            default=opt.default,
            help=f"{opt.help} (default: %(default)s)",
        )


def from_cli_args(original, cls, args: argparse.Namespace):
    """AROUND `ServerArgs.from_cli_args`: attach `_lynx` when `--lynx` was given."""
    server_args = original(cls, args)
    if getattr(args, "lynx", False):
        try:
            config = LynxConfig(**{o.field: getattr(args, f"lynx_{o.field}") for o in options()})
        except ValueError as exc:
            raise SystemExit(f"sglang: error: {exc}") from None
        server_args._lynx = config
    return server_args


HOOKS = (
    Hook(targets.SERVER_ARGS_ADD_CLI_ARGS, add_cli_args, "AFTER"),
    Hook(targets.SERVER_ARGS_FROM_CLI_ARGS, from_cli_args, "AROUND"),
)
