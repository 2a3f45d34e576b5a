"""`lynx_cpu`: an out-of-tree SGLang platform that serves on a plain CPU.

SGLang's in-tree CPU platform needs a CPU build of sgl-kernel that no registry
ships. This platform reports itself as out-of-tree with device type "cpu", so
SGLang keeps `is_cpu()` false (no sgl-kernel CPU import is reached) and its fused
ops fall back to their pure-PyTorch `forward_native` paths.

It is chosen with `SGLANG_PLATFORM=lynx_cpu`, or automatically when the machine
has no accelerator; on GPU machines `activate()` returns None and SGLang picks
its usual platform.
"""

from __future__ import annotations

import torch
from sglang.srt.platforms.cpu import CpuDeviceMixin
from sglang.srt.platforms.device_mixin import PlatformEnum
from sglang.srt.platforms.interface import PlatformCapabilities, SRTPlatform

PLATFORM_NAME = "lynx_cpu"
PLATFORM_CLASS = "lynx_patches.platform:LynxCpuPlatform"


def _has_accelerator() -> bool:
    if torch.cuda.is_available():
        return True
    for name in ("xpu", "npu", "mps"):
        backend = getattr(torch, name, None)
        if backend is not None and getattr(backend, "is_available", lambda: False)():
            return True
    return False


def activate() -> str | None:
    """Entry point of group `sglang.srt.platforms`: the class path, or None."""
    return None if _has_accelerator() else PLATFORM_CLASS


class LynxCpuPlatform(CpuDeviceMixin, SRTPlatform):
    """Pure-PyTorch CPU serving: torch_native attention, pytorch sampling."""

    _enum = PlatformEnum.OOT
    device_name = "cpu"
    device_type = "cpu"
    capabilities = PlatformCapabilities()

    def get_device(self, device_id: int = 0) -> str:
        # SGLang's serving hook compares this with strings; a torch.device breaks it.
        return "cpu"

    def is_pin_memory_available(self, device=None) -> bool:
        return False

    def get_default_attention_backend(self) -> str:
        return "torch_native"

    def get_dispatch_key_name(self) -> str:
        return "native"

    def apply_server_args_defaults(self, server_args) -> None:
        """Default what the CPU needs; an explicit user choice is kept."""
        if server_args.attention_backend is None:
            server_args.attention_backend = "torch_native"
        if server_args.sampling_backend is None:
            server_args.sampling_backend = "pytorch"
        server_args.disable_cuda_graph = True
        server_args.disable_overlap_schedule = True
        if server_args.page_size is None:
            server_args.page_size = 1
        # An idle scheduler otherwise polls in a busy loop: on a CPU that core is
        # the one the busy servers' matmuls need.
        server_args.sleep_on_idle = True
        if server_args.disaggregation_mode == "decode":
            # The default host backup pool registers pinned memory with CUDA.
            server_args.disaggregation_decode_retraction_backup = "cpu_tensor"
