"""Compile every Lynx Triton kernel for an NVIDIA GPU (sm_90 unless told) on a machine without one.

The kernel tests run the kernels under Triton's interpreter, which takes
Python semantics where the compiler would refuse or mis-bind (an argument
named like a local of Triton's launcher, say). This script drives the real
launch path instead: the checked entry points over CPU tensors, each launch
bound by Triton's own argument binder and compiled to a cubin (Triton's
bundled ptxas), with a stand-in driver that names the target and launches
nothing.

Run it without ``TRITON_INTERPRET`` (``--arch 80`` for an A100); prints one
line per kernel and specialization compiled, exits 0 when every launch
compiled.
"""

from __future__ import annotations

import argparse
import sys

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.runtime import driver
from triton.runtime.jit import JITFunction


class CompileOnlyDriver:
    """Stands in for the CUDA driver: one device, one stream, the given target; never launches."""

    def __init__(self, target: GPUTarget) -> None:
        self.target = target

    def get_current_device(self) -> int:
        return 0

    def get_current_stream(self, device: int | None = None) -> int:
        return 0

    def get_current_target(self) -> GPUTarget:
        return self.target


def compile_all(target: GPUTarget) -> list[str]:
    """Encode, decode every stage count and upgrade for each preset and a three-stage spec."""
    import lynx_kernels
    from lynx.codec import CodecSpec
    from lynx.codec import pool as reference

    compiled: list[str] = []

    def compile_only(kernel: JITFunction, grid):
        def launch(*args, **kwargs):
            binary = kernel.run(*args, grid=grid, warmup=True, **kwargs)
            compiled.append(f"{kernel.__name__}: {len(binary.asm['cubin'])} bytes of cubin")

        return launch

    generator = torch.Generator().manual_seed(0)
    k_pool = torch.randn(300, 2, 128, generator=generator).to(torch.bfloat16)
    v_pool = torch.randn(300, 2, 128, generator=generator).to(torch.bfloat16)
    slots = torch.randperm(300, generator=generator)[:200]
    specs = [CodecSpec.preset(name) for name in CodecSpec.preset_names()] + [CodecSpec(stage_bits=(2, 2, 4))]
    driver.set_active(CompileOnlyDriver(target))
    JITFunction.__getitem__ = compile_only
    for spec in specs:
        lynx_kernels.encode_from_pool(k_pool, v_pool, slots, spec)
        encoded = reference.encode_from_pool(k_pool, v_pool, slots, spec)
        for stages in range(1, spec.num_stages + 1):
            lynx_kernels.decode_into_pool(encoded, k_pool.clone(), v_pool.clone(), slots, stages)
        if spec.num_stages > 1:
            lynx_kernels.upgrade_in_pool(encoded, k_pool.clone(), v_pool.clone(), slots)
    return compiled


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", type=int, default=90, help="compute capability x 10 (default 90, Hopper)")
    target = GPUTarget("cuda", parser.parse_args().arch, 32)
    print(f"triton {triton.__version__}, target {target}")
    for line in compile_all(target):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
