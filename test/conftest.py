"""Shared fixtures: the real model and real SGLang servers, started once per session."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

SERVED_MODEL = "smollm2"


@pytest.fixture(scope="session")
def model_path() -> Path:
    from lynx.models import prepare_smollm2

    return prepare_smollm2()


@pytest.fixture(scope="session")
def server_logs(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("server-logs")


@pytest.fixture(scope="session")
def lynx_server(model_path, server_logs):
    """The README's server: real SGLang with --lynx, SmolLM2, this CPU."""
    from lynx_testing.launch import SGLangServer

    with SGLangServer(
        model_path,
        ["--lynx", "--served-model-name", SERVED_MODEL],
        log_path=server_logs / "lynx-server.log",
    ) as server:
        yield server
