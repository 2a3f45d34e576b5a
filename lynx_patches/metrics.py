"""Per-request Lynx metrics in the response's `meta_info["lynx"]`.

The decode scheduler keeps a snapshot dict on the request as SGLang
"customized info", one entry per output token so that every later streamed
chunk carries the latest snapshot; the tokenizer manager then reduces SGLang's
accumulated list to that latest dict, so clients read a plain dict.
"""

from __future__ import annotations

from lynx_patches import targets
from lynx_patches.selfcheck import Hook

KEY = "lynx"


def attach(req, metrics: dict) -> None:
    """Set (or replace) the request's Lynx metrics snapshot."""
    info = req.customized_info or {}
    info[KEY] = [dict(metrics)] * max(1, len(req.output_ids))
    req.customized_info = info


def unwrap_meta_info(result, manager, meta_info, *args, **kwargs):
    """AFTER `TokenizerManager.update_request_meta_info`: the latest snapshot, not the list."""
    value = meta_info.get(KEY)
    if isinstance(value, list):
        snapshots = [v for v in value if isinstance(v, dict)]
        if snapshots:
            meta_info[KEY] = snapshots[-1]
    return None


HOOKS = (Hook(targets.TOKENIZER_META_INFO, unwrap_meta_info, "AFTER"),)
