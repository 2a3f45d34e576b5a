"""The kernels bind and compile as a GPU launch would (the interpreter tests cannot tell)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("arch", [90, 80], ids=["hopper", "ampere"])
def test_every_kernel_binds_and_compiles_for_nvidia_gpus_without_one(arch):
    """Every launch of every preset goes through Triton's argument binder and compiler for sm_90
    and sm_80 (`test/support/compile_kernels.py`), in a process without ``TRITON_INTERPRET``."""
    triton = pytest.importorskip("triton")
    if "nvidia" not in triton.backends.backends:
        pytest.skip("this triton has no CUDA backend to compile with")
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "python"), str(ROOT / "kernels"), env.get("PYTHONPATH", "")])
    script = ROOT / "test" / "support" / "compile_kernels.py"
    command = [sys.executable, str(script), "--arch", str(arch)]
    run = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    compiled = run.stdout.splitlines()[1:]
    names = {line.split(":")[0] for line in compiled}
    assert names == {"_encode_key_kernel", "_encode_value_kernel", "_decode_key_kernel", "_decode_value_kernel"}
    assert all(int(line.split()[1]) > 0 for line in compiled)
