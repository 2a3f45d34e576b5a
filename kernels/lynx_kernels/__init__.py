"""Triton kernels for the Lynx codec (GPU hot path; CPU tests run them under TRITON_INTERPRET=1).

Each public function has the signature of its pure-PyTorch reference in
:mod:`lynx.codec.pool`; :func:`lynx.codec.pool.select_backend` chooses
between them. ``encode.launch_encode`` and ``decode.launch_decode`` launch
without validation or host synchronisation, for callers that validated a
request once and for benchmarks.
"""

from lynx_kernels.decode import decode_into_pool, upgrade_in_pool
from lynx_kernels.encode import encode_from_pool
from lynx_kernels.plan import supports

__all__ = ["decode_into_pool", "encode_from_pool", "supports", "upgrade_in_pool"]
