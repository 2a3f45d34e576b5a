"""Shared fixtures: the real model and real SGLang servers, started once per session."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")



def pytest_addoption(parser):
    parser.addoption("--extended", action="store_true", help="also run tests marked extended (soak, fault matrix)")


def pytest_collection_modifyitems(config, items):
    if config.getoption("--extended"):
        return
    skip = pytest.mark.skip(reason="extended tier: run with --extended")
    for item in items:
        if "extended" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def model_path() -> Path:
    from lynx_deploy.models import prepare_smollm2

    return prepare_smollm2()


@pytest.fixture(scope="session")
def server_logs(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("server-logs")


@pytest.fixture(scope="session")
def lynx_server(model_path, server_logs):
    """The README's server: real SGLang with --lynx, SmolLM2, this CPU."""
    from lynx_deploy.deployment import SERVED_MODEL
    from lynx_deploy.server import SGLangServer

    with SGLangServer(
        model_path,
        ["--lynx", "--served-model-name", SERVED_MODEL],
        log_path=server_logs / "lynx-server.log",
    ) as server:
        yield server
