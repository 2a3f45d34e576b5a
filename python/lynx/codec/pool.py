"""Encode from and decode into a token-indexed KV pool: reference and dispatch.

A pool holds one layer's keys (or values) for many requests,
``[pool_size, kv_heads, head_dim]``; one request's tokens sit at arbitrary
slots ``token_indices``. :func:`encode_from_pool`, :func:`decode_into_pool`
and :func:`upgrade_in_pool` are the pure-PyTorch specification of the Triton
kernels in ``lynx_kernels``, which have the same signatures.
:func:`gather_encode`, :func:`scatter_decode` and :func:`scatter_upgrade` are
the one place that chooses between the two.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable

import torch

from lynx.codec.codec import EncodedKV, decode, encode
from lynx.codec.pool_checks import check_decode_target, check_pools, check_upgrade
from lynx.codec.spec import CodecSpec

BACKENDS = ("auto", "triton", "reference")


def encode_from_pool(
    k_pool: torch.Tensor, v_pool: torch.Tensor, token_indices: torch.Tensor, spec: CodecSpec
) -> EncodedKV:
    """Encode the request's tokens straight from the pool.

    Args:
        k_pool, v_pool: ``[pool_size, kv_heads, head_dim]`` of one dtype
            (float16, bfloat16 or float32) and device, any strides.
        token_indices: ``[T]`` int64 (or int32) slots in ``[0, pool_size)``,
            in token order; repeats are allowed.
        spec: codec configuration.

    Returns:
        ``encode(k_pool[token_indices], v_pool[token_indices], spec)``.
    """
    check_pools(k_pool, v_pool, token_indices)
    return encode(k_pool[token_indices], v_pool[token_indices], spec)


def decode_into_pool(
    encoded: EncodedKV,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    token_indices: torch.Tensor,
    stages: int | None = None,
) -> None:
    """Write the decode of the first ``stages`` streams into pool slots.

    Args:
        encoded: streams of ``T`` tokens with the pools' ``kv_heads`` and
            ``head_dim``, on the pools' device.
        k_pool, v_pool: ``[pool_size, kv_heads, head_dim]``, written in place.
        token_indices: ``[T]`` distinct slots in ``[0, pool_size)``; token
            ``i`` goes to slot ``token_indices[i]``.
        stages: streams to use, as in :func:`lynx.codec.decode`.

    ``decode(encoded, stages)``, cast to the pool dtype, lands in
    ``k_pool[token_indices]`` and ``v_pool[token_indices]``; other slots are
    untouched.
    """
    check_decode_target(encoded, k_pool, v_pool, token_indices)
    key, value = decode(encoded, stages)
    k_pool[token_indices] = key.to(k_pool.dtype)
    v_pool[token_indices] = value.to(v_pool.dtype)


def upgrade_in_pool(
    encoded: EncodedKV, k_pool: torch.Tensor, v_pool: torch.Tensor, token_indices: torch.Tensor
) -> None:
    """Replace anchor-only values in pool slots by the decode of every stream.

    Called after ``decode_into_pool(..., stages=1)`` once the later streams
    have arrived (``encoded`` holds at least two). The slots end up
    bit-identical to ``decode_into_pool(encoded, ...)`` with all streams.

    Exactness is why this recomputes each value as ``min + scale * level``
    from the codes of every stage instead of adding a residual delta to what
    the slots hold: the anchor-only values were already rounded to the pool
    dtype (e.g. bf16), and ``round(a) + delta`` does not round like
    ``round(a + delta)``. So the slots' previous contents are never read, and
    the anchor stream (sink tokens, minima, scales, stage-0 codes) is needed
    again.

    Args:
        encoded: at least two streams (anchor plus residual).
        k_pool, v_pool, token_indices: as in :func:`decode_into_pool`.
    """
    check_upgrade(encoded)
    decode_into_pool(encoded, k_pool, v_pool, token_indices)


def gather_encode(
    k_pool: torch.Tensor, v_pool: torch.Tensor, token_indices: torch.Tensor, spec: CodecSpec, backend: str = "auto"
) -> EncodedKV:
    """:func:`encode_from_pool` by the backend :func:`select_backend` picks."""
    return _implementation("encode_from_pool", backend, k_pool, spec)(k_pool, v_pool, token_indices, spec)


def scatter_decode(
    encoded: EncodedKV,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    token_indices: torch.Tensor,
    stages: int | None = None,
    backend: str = "auto",
) -> None:
    """:func:`decode_into_pool` by the backend :func:`select_backend` picks."""
    spec = encoded.spec if isinstance(encoded, EncodedKV) else None
    _implementation("decode_into_pool", backend, k_pool, spec)(encoded, k_pool, v_pool, token_indices, stages)


def scatter_upgrade(
    encoded: EncodedKV, k_pool: torch.Tensor, v_pool: torch.Tensor, token_indices: torch.Tensor, backend: str = "auto"
) -> None:
    """:func:`upgrade_in_pool` by the backend :func:`select_backend` picks."""
    spec = encoded.spec if isinstance(encoded, EncodedKV) else None
    _implementation("upgrade_in_pool", backend, k_pool, spec)(encoded, k_pool, v_pool, token_indices)


def select_backend(backend: str, pool: torch.Tensor, spec: CodecSpec | None) -> str:
    """``"triton"`` or ``"reference"``: which implementation serves a call.

    ``"reference"`` always uses PyTorch. ``"triton"`` uses the kernels
    whatever the device (CPU tensors need ``TRITON_INTERPRET=1`` set before
    Triton is imported). ``"auto"`` uses them for CUDA pools when Triton is
    installed. Either way a spec or head_dim the kernels do not handle
    natively (see ``lynx_kernels.supports``) goes to the reference, and so do
    arguments too malformed to inspect, for the reference to reject.
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "reference" or not isinstance(spec, CodecSpec):
        return "reference"
    if not isinstance(pool, torch.Tensor) or pool.dim() != 3:
        return "reference"
    if backend == "auto" and (pool.device.type != "cuda" or importlib.util.find_spec("triton") is None):
        return "reference"
    import lynx_kernels

    return "triton" if lynx_kernels.supports(spec, pool.shape[2]) else "reference"


def _implementation(name: str, backend: str, pool: torch.Tensor, spec: CodecSpec | None) -> Callable:
    if select_backend(backend, pool, spec) == "triton":
        import lynx_kernels

        return getattr(lynx_kernels, name)
    return _REFERENCE[name]


_REFERENCE: dict[str, Callable] = {
    "encode_from_pool": encode_from_pool,
    "decode_into_pool": decode_into_pool,
    "upgrade_in_pool": upgrade_in_pool,
}
