"""SGLang's own Mooncake PD backend on the `lynx_cpu` platform (the stock baseline).

`MooncakeKVSender` declares `supports_host_tensor_indices`, which sends the
prefill scheduler down a path that copies page indices into pinned memory and
records a `torch.cuda.Event`: CUDA-only calls that fail on a plain CPU when
the first request reaches them. On `lynx_cpu` each sender is told it has no
such support, so the prefill hands it page indices computed on the host
(SGLang's path for every other backend). On any other platform nothing
changes. The hook applies whether or not a server runs with `--lynx`.
"""

from __future__ import annotations

# SGLang resolves its platform on first use, loading `lynx_patches.platform` through its
# entry point: it is resolved before that module is imported here, never while it is half-imported.
from sglang.srt.platforms import current_platform

from lynx_patches import targets
from lynx_patches.platform import LynxCpuPlatform
from lynx_patches.selfcheck import Hook


def on_lynx_cpu() -> bool:
    """Whether this SGLang process serves on the `lynx_cpu` platform."""
    return isinstance(current_platform, LynxCpuPlatform)


def mooncake_sender_init(result, sender, *args, **kwargs):
    """AFTER `MooncakeKVSender.__init__`: no host tensor indices on `lynx_cpu`."""
    if on_lynx_cpu():
        sender.supports_host_tensor_indices = False
    return None


HOOKS = (Hook(targets.MOONCAKE_SENDER_INIT, mooncake_sender_init, "AFTER"),)
