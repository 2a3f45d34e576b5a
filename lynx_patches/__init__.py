"""SGLang glue for Lynx, registered through the `sglang.srt.plugins` entry point
(`lynx_patches.hooks:register`).

Every hook is listed in `lynx_patches.hooks.all_hooks()`; the self-check
(`lynx_patches.selfcheck`) proves at start-up that each one is live.

This package imports nothing: SGLang imports it (for the `lynx_cpu` platform,
`lynx_patches.platform`) while it resolves its platform, before its own modules
import cleanly. The hook table, which imports SGLang, is loaded when SGLang
loads its general plugins.
"""
