"""Turning the caller's stream buffers into flat byte views, without copying where possible."""

from __future__ import annotations

import numpy as np


def byte_view(data) -> memoryview:
    """``data`` as a 1-D uint8 memoryview of its bytes.

    Bytes-like objects (the buffer protocol) must be C-contiguous and are viewed as raw bytes (any
    format). numpy arrays and CPU torch tensors must have dtype uint8, any
    shape; a non-contiguous one is copied, a contiguous one is not. Anything
    else (other dtypes, GPU tensors, lists) raises ValueError.
    """
    if not isinstance(data, np.ndarray) and not hasattr(data, "__dlpack__"):
        try:
            view = memoryview(data)
        except TypeError as exc:
            raise ValueError(f"data must be bytes-like or a CPU uint8 array/tensor, got {type(data).__name__}") from exc
        if not view.c_contiguous:
            raise ValueError("a bytes-like buffer to send must be C-contiguous")
        return view.cast("B") if (view.format, view.ndim) != ("B", 1) else view
    try:
        array = np.asarray(data)
    except (TypeError, RuntimeError) as exc:
        raise ValueError(f"data must be bytes-like or a CPU uint8 array/tensor: {exc}") from exc
    if array.dtype != np.uint8:
        raise ValueError(f"data must have dtype uint8, got {array.dtype}")
    return memoryview(np.ascontiguousarray(array).reshape(-1))
