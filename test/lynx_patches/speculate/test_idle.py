"""The idle wait of a decode scheduler whose requests wait for KV: what wakes it, and when it does not wait."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest
import zmq

from lynx_patches.speculate.idle import IdleWait


@pytest.fixture
def sockets():
    """A PUSH/PULL pair standing in for the tokenizer's socket into the scheduler."""
    context = zmq.Context()
    pull, push = context.socket(zmq.PULL), context.socket(zmq.PUSH)
    port = pull.bind_to_random_port("tcp://127.0.0.1")
    push.connect(f"tcp://127.0.0.1:{port}")
    yield pull, push
    pull.close(linger=0)
    push.close(linger=0)
    context.term()


def _waiter(pull=None, fully_idle=False, parked=False, max_wait_s=5.0):
    poller = zmq.Poller()
    if pull is not None:
        poller.register(pull, zmq.POLLIN)
    scheduler = SimpleNamespace(is_fully_idle=lambda: fully_idle, idle_sleeper=SimpleNamespace(poller=poller))
    landed = threading.Event()
    waiter = IdleWait(scheduler, landed, parked=lambda: parked, max_wait_s=max_wait_s)
    return waiter, landed


def _timed(waiter) -> float:
    started = time.monotonic()
    waiter.wait()
    return time.monotonic() - started


def test_a_fully_idle_scheduler_is_left_to_sglangs_own_sleep():
    waiter, _ = _waiter(fully_idle=True)
    assert _timed(waiter) < 1.0


def test_with_nothing_happening_it_sleeps_for_the_whole_bound():
    waiter, _ = _waiter(max_wait_s=0.05)
    assert _timed(waiter) >= 0.05


def test_a_message_on_the_schedulers_sockets_ends_the_wait(sockets):
    pull, push = sockets
    waiter, _ = _waiter(pull)
    threading.Timer(0.02, lambda: push.send(b"request")).start()
    assert _timed(waiter) < 1.0


def test_a_transfer_update_ends_the_wait_and_is_consumed():
    waiter, _ = _waiter()
    threading.Timer(0.02, waiter.wake).start()
    assert _timed(waiter) < 1.0
    waiter.max_wait_s = 0.05
    assert _timed(waiter) >= 0.05, "the wake-up was used up"


def test_a_landed_residual_ends_the_wait_of_parked_requests():
    waiter, landed = _waiter(parked=True)
    threading.Timer(0.02, landed.set).start()
    assert _timed(waiter) < 1.0


def test_wake_ups_never_block_the_caller():
    waiter, _ = _waiter()
    for _ in range(100_000):
        waiter.wake()
    assert _timed(waiter) < 1.0


def test_a_rank_whose_residual_waits_for_the_other_ranks_does_not_wait():
    waiter, _ = _waiter(parked=True)
    waiter.ready = lambda: True
    assert _timed(waiter) < 1.0


def test_a_rank_without_request_sockets_waits_no_longer_than_the_bound():
    """Ranks above 0 have no idle sleeper: nothing but the bound ends their wait, so a rank 0
    blocked in a collective waits at most that long for them."""
    scheduler = SimpleNamespace(is_fully_idle=lambda: False, idle_sleeper=None)
    waiter = IdleWait(scheduler, threading.Event(), parked=lambda: True, max_wait_s=0.05)
    assert 0.05 <= _timed(waiter) < 1.0
