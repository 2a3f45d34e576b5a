"""`DecodeSideView`: the decode side offers every member of the view, with the view's parameters."""

from __future__ import annotations

import inspect
import subprocess
import sys
import threading

import pytest
from lynx.config import LynxConfig
from pd_fakes import SECRET, DecodeHost, config

from lynx.pd.consumer import DecodeSideView
from lynx.pd.decode_side import DecodeSide

ATTRIBUTES = {"config": LynxConfig, "landed": threading.Event, "draft_window_s": float}
METHODS = {name for name, member in vars(DecodeSideView).items() if not name.startswith("_") and callable(member)}


@pytest.fixture
def side():
    side = DecodeSide(config(), SECRET, DecodeHost(), "127.0.0.1")
    yield side
    side.close()


def test_the_view_names_the_attributes_and_methods_the_controller_uses():
    assert set(DecodeSideView.__annotations__) == set(ATTRIBUTES)
    assert METHODS == {"timings", "check", "room_state", "apply_residual", "forget"}


def test_the_decode_side_holds_each_attribute_of_the_view_with_its_type(side):
    for name, kind in ATTRIBUTES.items():
        assert isinstance(getattr(side, name), kind), name


@pytest.mark.parametrize("name", sorted(METHODS))
def test_the_decode_side_takes_each_method_of_the_view_with_its_parameters(name):
    view = inspect.signature(getattr(DecodeSideView, name))
    implementation = inspect.signature(getattr(DecodeSide, name))
    assert list(implementation.parameters) == list(view.parameters)
    assert implementation.return_annotation == view.return_annotation


def test_the_view_imports_nothing_from_the_engine():
    code = "import sys, lynx.pd.consumer; print('sglang' in sys.modules, 'torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["False", "False"]
