"""Prefill/decode pairs for each variant: Lynx's (`PDDeployment`) and SGLang's stock Mooncake backend.

The stock pair is the same two SGLang servers and router without `--lynx`,
with `--disaggregation-transfer-backend mooncake` over TCP; on the `lynx_cpu`
platform it needs one hook (`lynx_patches.stock`). Mooncake's engine listens
on every interface, so it may only start inside a private network namespace.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from evaluation.plan import ModelPlan, Variant
from lynx_deploy.deployment import PDDeployment
from lynx_deploy.server import ServerStartError

STOCK_ENV = {"MOONCAKE_PROTOCOL": "tcp", "MC_FORCE_TCP": "1"}
# Machine-wide memory accounting refuses a start while other servers hold memory; wait, then retry.
_MEMORY_REFUSAL = "leave no GPU memory for the KV cache"


class StockDeployment(PDDeployment):
    """SGLang's own PD: the Mooncake transfer backend over TCP, no Lynx option on either server."""

    def __init__(self, model_path: str | Path, *, extra_args=(), env=None, **kwargs) -> None:
        backend = ["--disaggregation-transfer-backend", "mooncake"]
        super().__init__(model_path, (), extra_args=[*extra_args, *backend], env={**STOCK_ENV, **(env or {})}, **kwargs)
        for server in (self.prefill, self.decode):
            server.command.remove("--lynx")


def deployment(plan: ModelPlan, variant: Variant, model_path: Path, log_dir: Path) -> PDDeployment:
    """The (not yet started) pair serving `variant` of `plan.model`."""
    kwargs = dict(log_dir=log_dir, max_total_tokens=plan.max_total_tokens, extra_args=plan.server_args)
    if variant.stock:
        return StockDeployment(model_path, **kwargs)
    return PDDeployment(model_path, variant.lynx_args(), **kwargs)


def start(make: Callable[[], PDDeployment], attempts: int = 3, pause_s: float = 45.0, log=print) -> PDDeployment:
    """Start a fresh deployment from `make()`, retrying when machine-wide memory refused a server."""
    for attempt in range(1, attempts + 1):
        pd = make()
        try:
            return pd.start()
        except ServerStartError as exc:
            pd.stop()
            if _MEMORY_REFUSAL not in str(exc) or attempt == attempts:
                raise
            log(f"a server found no memory for its KV cache (attempt {attempt}); retrying in {pause_s:g} s")
            time.sleep(pause_s)
        except BaseException:
            pd.stop()
            raise
    raise AssertionError("unreachable")


def http_ports(pd: PDDeployment) -> list[int]:
    """Ports whose traffic is not on the KV link: both servers' HTTP, the router, the bootstrap server."""
    return [pd.prefill.port, pd.decode.port, pd.router_port, pd.bootstrap_port]
