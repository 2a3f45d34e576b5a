"""scripts/container_check.sh parses its options without podman, and takes the Debian mirror only from apt.

The check itself (image build, containers, compose) runs by hand: docs/DEPLOY.md.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "container_check.sh"


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=30)


def test_help_lists_every_mode_and_ends_with_the_comment():
    result = run("--help")
    assert result.returncode == 0, result.stderr
    for option in ("--compose", "--no-cache", "--prepare", "LYNX_CHECK_TIMEOUT"):
        assert option in result.stdout
    assert "set -euo pipefail" not in result.stdout


def test_an_unknown_option_is_refused_before_anything_runs():
    result = run("--bogus")
    assert result.returncode == 2 and "unknown argument: --bogus" in result.stderr


def test_no_package_mirror_is_written_into_the_script():
    text = SCRIPT.read_text()
    assert "scripts/debian_mirror.sh" in text
    assert not re.search(r"https?://[\w.-]*debian", text), "a fixed Debian mirror URL in container_check.sh"
