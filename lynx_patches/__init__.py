"""SGLang glue for Lynx, registered through the `sglang.srt.plugins` entry point.

Every hook is listed in `lynx_patches.hooks.all_hooks()`; the self-check
(`lynx_patches.selfcheck`) proves at start-up that each one is live.

This package stays cheap to import: SGLang imports it (for the `lynx_cpu`
platform, `lynx_patches.platform`) while it resolves its platform, before its
own modules import cleanly. The hook table, which imports SGLang, is imported
when SGLang calls `register()`.
"""


def register() -> None:
    """Entry point: register every Lynx hook with SGLang's HookRegistry."""
    from lynx_patches.hooks import register as register_hooks

    register_hooks()
