"""scripts/k8s_validate.py as a module: its kustomize rendering serves the manifest tests too."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "k8s_validate.py"


@pytest.fixture(scope="session")
def k8s_validate():
    spec = importlib.util.spec_from_file_location("k8s_validate", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
