"""Argument checks of the pool codec, shared by the reference (`lynx.codec.pool`) and the kernels.

A leaf beside the codec: `lynx_kernels` validates its arguments with these
same functions, so the kernels and the reference refuse the same inputs with
the same errors, and neither imports the other for it.
"""

from __future__ import annotations

import torch

from lynx.codec.codec import EncodedKV
from lynx.codec.layout import INPUT_DTYPES

INDEX_DTYPES = (torch.int32, torch.int64)


def check_pools(
    k_pool: torch.Tensor, v_pool: torch.Tensor, token_indices: torch.Tensor, distinct: bool = False
) -> None:
    """Raise ValueError unless the pools and slot indices fit together.

    Pools must be ``[pool_size, kv_heads, head_dim]`` tensors of one shape,
    supported dtype and device; ``token_indices`` a non-empty 1-D int32/int64
    tensor on that device with every entry in ``[0, pool_size)``, and with no
    repeats when ``distinct`` (a slot cannot receive two tokens).
    """
    for name, pool in (("k_pool", k_pool), ("v_pool", v_pool)):
        if not isinstance(pool, torch.Tensor) or pool.dim() != 3:
            raise ValueError(f"{name} must be a [pool_size, kv_heads, head_dim] tensor")
        if pool.dtype not in INPUT_DTYPES:
            raise ValueError(f"{name} dtype must be one of {INPUT_DTYPES}, got {pool.dtype}")
    if k_pool.shape != v_pool.shape or k_pool.dtype != v_pool.dtype:
        raise ValueError(
            f"k_pool and v_pool must share shape and dtype; got {tuple(k_pool.shape)} {k_pool.dtype} "
            f"and {tuple(v_pool.shape)} {v_pool.dtype}"
        )
    if k_pool.device != v_pool.device:
        raise ValueError(f"k_pool is on {k_pool.device}, v_pool on {v_pool.device}; they must share a device")
    if not isinstance(token_indices, torch.Tensor) or token_indices.dim() != 1:
        raise ValueError("token_indices must be a 1-D tensor")
    if token_indices.dtype not in INDEX_DTYPES:
        raise ValueError(f"token_indices dtype must be one of {INDEX_DTYPES}, got {token_indices.dtype}")
    if token_indices.numel() == 0:
        raise ValueError("token_indices is empty; there is nothing to encode or decode")
    if token_indices.device != k_pool.device:
        raise ValueError(f"token_indices is on {token_indices.device}, the pools on {k_pool.device}")
    pool_size = k_pool.shape[0]
    low, high = torch.stack(torch.aminmax(token_indices)).tolist()
    if low < 0 or high >= pool_size:
        raise ValueError(f"token_indices must lie in [0, {pool_size}), got values in [{low}, {high}]")
    if distinct and torch.unique(token_indices).numel() != token_indices.numel():
        raise ValueError("token_indices repeats a slot; each token must go to its own slot")


def check_decode_target(
    encoded: EncodedKV, k_pool: torch.Tensor, v_pool: torch.Tensor, token_indices: torch.Tensor
) -> None:
    """Raise ValueError unless ``encoded`` can be written into these pool slots."""
    if not isinstance(encoded, EncodedKV):
        raise ValueError(f"encoded must be an EncodedKV, got {type(encoded).__name__}")
    check_pools(k_pool, v_pool, token_indices, distinct=True)
    if encoded.num_tokens != token_indices.numel():
        raise ValueError(f"encoded holds {encoded.num_tokens} tokens but {token_indices.numel()} slots were given")
    if (encoded.kv_heads, encoded.head_dim) != tuple(k_pool.shape[1:]):
        raise ValueError(
            f"encoded tokens are [{encoded.kv_heads}, {encoded.head_dim}] but pool slots are "
            f"{list(k_pool.shape[1:])}"
        )
    if encoded.streams[0].device != k_pool.device:
        raise ValueError(f"encoded streams are on {encoded.streams[0].device}, the pools on {k_pool.device}")


def check_upgrade(encoded: EncodedKV) -> None:
    """Raise ValueError unless ``encoded`` holds a stream beyond the anchor."""
    if not isinstance(encoded, EncodedKV):
        raise ValueError(f"encoded must be an EncodedKV, got {type(encoded).__name__}")
    if encoded.num_received_stages < 2:
        raise ValueError("an upgrade needs at least one stream beyond the anchor; only the anchor is present")
