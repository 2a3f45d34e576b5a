"""The PD deployments shared by every real-pair module of this folder (each runs once per session)."""

from __future__ import annotations

import secrets

import pytest
from pd_scenarios import QWEN2_DEPLOYMENTS, LazyRuns
from pd_suites import suites


@pytest.fixture(scope="session")
def pd_bodies(model_path):
    from transformers import AutoTokenizer

    return suites(AutoTokenizer.from_pretrained(str(model_path)))


@pytest.fixture(scope="session")
def pd_runs(model_path, pd_bodies, server_logs, request):
    secret = server_logs / "pd-modes-secret"
    secret.write_text(secrets.token_hex(32))
    runs = LazyRuns(model_path, pd_bodies, server_logs, secret, extended=request.config.getoption("--extended"))
    yield runs
    runs.close()


@pytest.fixture(scope="session")
def qwen2_runs(server_logs, request):
    """The Qwen2 deployments (`pd_scenarios.QWEN2_DEPLOYMENTS`), each started the first time a test needs it."""
    from lynx_deploy.models import prepare
    from transformers import AutoTokenizer

    path = prepare("qwen2")
    secret = server_logs / "pd-qwen2-secret"
    secret.write_text(secrets.token_hex(32))
    bodies = suites(AutoTokenizer.from_pretrained(str(path)))
    extended = request.config.getoption("--extended")
    runs = LazyRuns(path, bodies, server_logs / "qwen2", secret, extended=extended, deployments=QWEN2_DEPLOYMENTS)
    yield runs
    runs.close()
