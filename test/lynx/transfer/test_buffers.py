"""Caller buffers become flat byte views, zero-copy when contiguous."""

import array

import numpy as np
import pytest
import torch

from lynx.transfer.buffers import byte_view


def test_contiguous_numpy_and_torch_buffers_are_viewed_not_copied():
    data = np.arange(24, dtype=np.uint8).reshape(4, 6)
    view = byte_view(data)
    data[0, 0] = 200
    assert view.nbytes == 24 and view[0] == 200
    tensor = torch.arange(10, dtype=torch.uint8)
    view = byte_view(tensor)
    tensor[3] = 99
    assert bytes(view) == bytes(tensor.numpy())


def test_non_contiguous_arrays_are_flattened_in_logical_order():
    tensor = torch.arange(12, dtype=torch.uint8).reshape(3, 4).t()
    assert bytes(byte_view(tensor)) == bytes(tensor.contiguous().numpy())


def test_bytes_like_objects_give_their_raw_bytes():
    assert bytes(byte_view(b"abc")) == b"abc"
    words = array.array("H", [1, 2])
    assert byte_view(words).nbytes == 4 and byte_view(words).format == "B"
    assert bytes(byte_view(memoryview(b"abcdef")[1:4])) == b"bcd"


@pytest.mark.parametrize(
    "data",
    [
        np.zeros(3, dtype=np.int16), torch.zeros(3), torch.zeros(3, requires_grad=True), [1, 2], "abc",
        memoryview(b"abcdef")[::2],
    ],
    ids=["int16", "float-tensor", "grad-tensor", "list", "str", "strided-memoryview"],
)
def test_anything_but_bytes_is_a_value_error(data):
    with pytest.raises(ValueError):
        byte_view(data)
