"""Run the Triton kernels on CPU tensors through Triton's interpreter.

``TRITON_INTERPRET=1`` must be set before Triton is first imported (it decides
how every ``@triton.jit`` function is built). Unless the caller already set
it, it is set here only while Triton and ``lynx_kernels`` are imported and
while each kernel test runs, so subprocesses that later tests start (SGLang
servers) do not inherit it. ``triton.experimental.gluon`` is imported with
them because it checks the mode once, when first imported.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from contextlib import contextmanager

import pytest

_VARIABLE = "TRITON_INTERPRET"


@contextmanager
def _interpret_mode():
    previous = os.environ.get(_VARIABLE)
    os.environ[_VARIABLE] = "1"
    try:
        yield
    finally:
        if previous is None:
            del os.environ[_VARIABLE]
        else:
            os.environ[_VARIABLE] = previous


def _import_kernels() -> str | None:
    """Import Triton in interpreter mode; return why the kernel tests must skip, or None."""
    if importlib.util.find_spec("triton") is None:
        return "triton is not installed; the kernel tests need it (under TRITON_INTERPRET=1 on CPU)"
    if "triton" in sys.modules and os.environ.get(_VARIABLE) != "1":
        return "triton was imported before TRITON_INTERPRET=1 could be set; rerun with TRITON_INTERPRET=1"
    with _interpret_mode():
        for module in ("triton", "triton.experimental.gluon", "lynx_kernels"):
            importlib.import_module(module)
    return None


SKIP_REASON = _import_kernels()


@pytest.fixture(autouse=True)
def _triton_interpreter(monkeypatch):
    if SKIP_REASON is not None:
        pytest.skip(SKIP_REASON)
    monkeypatch.setenv(_VARIABLE, "1")

