"""The Lynx config of this SGLang process: the `LynxConfig` its server args carry (`--lynx`), or None.

The check that each scheduler process starts with every hook live is
`lynx_patches.hooks.scheduler_init`, beside the hook table it reads.
"""

from __future__ import annotations


def lynx_config_of(server_args):
    """The `LynxConfig` a `--lynx` server carries, or None."""
    return getattr(server_args, "_lynx", None)


def current_config():
    """The `LynxConfig` of this SGLang process's published server args, or None."""
    from sglang.srt.runtime_context import get_server_args

    try:
        return lynx_config_of(get_server_args())
    except (AttributeError, ValueError):
        return None
