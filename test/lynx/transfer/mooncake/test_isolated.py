"""The Mooncake engine tests, run in a private network namespace with nothing but loopback.

Mooncake's engine (0.3.13) listens on every interface whatever address it is
given; inside the namespace its ports exist on an isolated loopback only.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from lynx_testing.netns import run_isolated

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[3]


@pytest.mark.slow
def test_the_mooncake_engine_tests_pass_in_a_private_network_namespace():
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(HERE / "test_transport.py")]
    result = run_isolated(command, cwd=ROOT, capture_output=True, text=True, timeout=1200)
    print(result.stdout[-4000:])
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert " passed" in result.stdout and "skipped" not in result.stdout.splitlines()[-1]
