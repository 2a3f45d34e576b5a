"""`lynx_cpu`: an out-of-tree SGLang platform that serves on a plain CPU.

SGLang's in-tree CPU platform needs a CPU build of sgl-kernel that no registry
ships. This platform reports itself as out-of-tree with device type "cpu", so
SGLang keeps `is_cpu()` false (no sgl-kernel CPU import is reached) and its fused
ops fall back to their pure-PyTorch `forward_native` paths.

It is chosen with `SGLANG_PLATFORM=lynx_cpu`, or automatically when the machine
has no accelerator; on GPU machines `activate()` returns None and SGLang picks
its usual platform.

Page sizes: torch_native gathers K and V token by token through `req_to_token`
and the paged allocator takes its torch path (no Triton here), so any
`--page-size` serves; 1 is the default. Tensor parallelism runs over gloo; see
`LynxCpuPlatform.init_backend` and `threads_bind` for the two SGLang CPU-path
gaps this platform closes.

SGLang resolves its platform on its first import, through `activate` here: a
process imports SGLang before this module (every SGLang process does), or
SGLang finds this module half-initialized and falls back to a bare platform.
"""

from __future__ import annotations

import importlib
import itertools
import os
from collections.abc import Sequence

import torch
from sglang.srt.platforms.cpu import CpuDeviceMixin
from sglang.srt.platforms.device_mixin import PlatformEnum
from sglang.srt.platforms.interface import PlatformCapabilities, SRTPlatform

PLATFORM_CLASS = "lynx_patches.platform:LynxCpuPlatform"
THREADS_BIND_ENV = "SGLANG_CPU_OMP_THREADS_BIND"
# SGLang modules whose weight loaders shard with zero padding only where `is_cpu()` holds.
PADDED_LOADER_MODULES = ("sglang.srt.layers.linear", "sglang.srt.layers.parameter")


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


def threads_bind(entries: int, cpus: Sequence[int]) -> str:
    """A `SGLANG_CPU_OMP_THREADS_BIND` value: `entries` groups of `cpus`, "|"-separated.

    Entry i (a rank's device id) gets the i-th contiguous share of `cpus`, or
    one CPU round-robin when there are fewer CPUs than entries.
    """
    if entries < 1 or not cpus:
        raise ValueError(
            f"need at least one entry and one CPU, got {entries} entries and CPUs {list(cpus)}"
        )
    if len(cpus) < entries:
        groups = [[cpus[i % len(cpus)]] for i in range(entries)]
    else:
        bounds = [len(cpus) * i // entries for i in range(entries + 1)]
        groups = [cpus[lo:hi] for lo, hi in itertools.pairwise(bounds)]
    return "|".join(",".join(map(str, group)) for group in groups)


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
        self._default_threads_bind(server_args)

    def _default_threads_bind(self, server_args) -> None:
        """Give every rank a share of this process's CPUs when ranks outnumber NUMA nodes.

        Unless `SGLANG_CPU_OMP_THREADS_BIND` is set, SGLang asserts at start-up
        that dp * tp * pp <= NUMA nodes (one rank per node), which refuses
        `--tp-size 2` on a one-node machine. The value is set here, in the
        launcher, so the scheduler processes it spawns inherit it; without
        sgl-kernel SGLang only logs it (threads are not pinned).
        """
        from sglang.srt.utils.common import get_cpu_ids_by_node

        ranks = server_args.dp_size * server_args.tp_size * server_args.pp_size
        if (
            ranks == 1
            or THREADS_BIND_ENV in os.environ
            or ranks <= len(get_cpu_ids_by_node())
        ):
            return
        # A rank's entry is indexed by its device id: base + rank * step at most.
        entries = server_args.base_gpu_id + (ranks - 1) * server_args.gpu_id_step + 1
        os.environ[THREADS_BIND_ENV] = threads_bind(
            entries, sorted(os.sched_getaffinity(0))
        )

    def init_backend(self) -> None:
        """In each worker: load tensor-parallel weights the way SGLang's own CPU platform does.

        On device "cpu" SGLang pads attention heads the TP size does not divide
        with zero heads (`adjust_config_with_unaligned_cpu_tp`: SmolLM2's 9 query
        and 3 KV heads become 12 and 4 at TP 2), but its weight loaders narrow
        with that padding only where `is_cpu()` holds, which is false for an
        out-of-tree platform; loading then fails with "start (128) + length (128)
        exceeds dimension size (192)". Those loaders read a module flag at call
        time; set it. Where nothing is padded (TP 1, divisible heads) the padded
        paths load exactly what the plain ones do.
        """
        for name in PADDED_LOADER_MODULES:
            importlib.import_module(name)._is_cpu = True
