"""SGLang glue for Lynx, registered through the `sglang.srt.plugins` entry point.

Every hook is listed in `lynx_patches.hooks.all_hooks()`; the self-check
(`lynx_patches.selfcheck`) proves at start-up that each one is live.
"""


def register() -> None:
    """Entry point: register every Lynx hook with SGLang's HookRegistry."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    from lynx_patches.hooks import all_hooks
    from lynx_patches.pd.registry import install_backend_choice

    for hook in all_hooks():
        HookRegistry.register(hook.target, hook.fn, HookType[hook.kind])
    # After the hooks: should this fail, `--lynx` still parses and the
    # self-check reports the missing backend instead of an unknown flag.
    install_backend_choice()
