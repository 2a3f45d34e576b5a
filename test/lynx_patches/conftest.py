"""The PD deployments shared by every real-pair module of this folder (each runs once per session)."""

from __future__ import annotations

import secrets

import pytest
from pd_scenarios import LazyRuns, suites


@pytest.fixture(scope="session")
def pd_bodies(model_path):
    from transformers import AutoTokenizer

    return suites(AutoTokenizer.from_pretrained(str(model_path)))


@pytest.fixture(scope="session")
def pd_runs(model_path, pd_bodies, server_logs, request):
    secret = server_logs / "pd-modes-secret"
    secret.write_text(secrets.token_hex(32))
    return LazyRuns(model_path, pd_bodies, server_logs, secret, extended=request.config.getoption("--extended"))
