"""KV layouts the lynx backend cannot move are refused at start-up, naming the layout and what it would need."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from sglang.srt.disaggregation.utils import DisaggregationMode
from sglang.srt.mem_cache.memory_pool import HybridLinearKVPool, MHATokenToKVPool, MLATokenToKVPool
from sglang.srt.mem_cache.swa_memory_pool import SWAKVPool

from lynx.config import LynxConfig
from lynx_patches.pd.manager import LynxKVManager
from lynx_patches.pd.pool import check_pool


def _bare(cls):
    """An instance of SGLang's pool class without allocating its buffers (only its type is checked)."""
    return object.__new__(cls)


@pytest.mark.parametrize(
    "cls,layout,needed",
    [
        (MLATokenToKVPool, "MLA", "a codec for the latent vector"),
        (SWAKVPool, "sliding-window", "moving both pools"),
        (HybridLinearKVPool, "linear-attention", "recurrent state at full precision"),
    ],
)
def test_each_unsupported_layout_is_named_with_what_it_would_need(cls, layout, needed):
    with pytest.raises(RuntimeError) as refusal:
        check_pool(_bare(cls))
    message = str(refusal.value)
    assert layout in message and needed in message and cls.__name__ in message
    assert "--disaggregation-transfer-backend" in message


def test_an_unknown_pool_is_refused_by_its_class_name():
    class SomeFuturePool:
        pass

    with pytest.raises(RuntimeError, match="SomeFuturePool"):
        check_pool(SomeFuturePool())


def test_a_quantized_kv_cache_is_refused():
    pool = _bare(MHATokenToKVPool)
    pool.dtype, pool.store_dtype = torch.float8_e4m3fn, torch.uint8
    with pytest.raises(RuntimeError, match="unquantized"):
        check_pool(pool)


def test_an_mla_backend_is_refused_before_anything_starts():
    server_args = SimpleNamespace(_lynx=LynxConfig(mode="int8", insecure=True))
    with pytest.raises(RuntimeError, match="MLA .*a codec for the latent vector"):
        LynxKVManager(None, DisaggregationMode.DECODE, server_args, is_mla_backend=True)
