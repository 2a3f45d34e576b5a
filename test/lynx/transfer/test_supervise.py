"""Supervised loops: a crash is reported and the loop restarted; too many crashes mark it broken."""

import threading

from lynx.transfer.supervise import Supervisor


def wait(condition, timeout_s=10.0):
    done = threading.Event()
    for _ in range(int(timeout_s / 0.01)):
        if condition():
            return True
        done.wait(0.01)
    return condition()


def test_a_crashed_loop_is_reported_and_runs_again_until_stopped():
    crashes, runs = [], []
    supervisor = Supervisor(lambda name, error: crashes.append((name, error)), backoff_s=0.01)

    def loop():
        runs.append(1)
        if len(runs) <= 2:
            raise RuntimeError(f"boom {len(runs)}")
        supervisor.stop.wait()

    supervisor.start("worker", loop)
    assert wait(lambda: len(runs) == 3)
    supervisor.close()
    assert crashes == [("worker", "RuntimeError: boom 1"), ("worker", "RuntimeError: boom 2")]
    assert supervisor.restarts == 2 and supervisor.broken is None


def test_too_many_crashes_in_the_window_mark_the_supervisor_broken_and_stop_restarting():
    runs = []
    supervisor = Supervisor(lambda name, error: None, max_restarts=3, window_s=60, backoff_s=0.0)

    def loop():
        runs.append(1)
        raise ValueError("always")

    supervisor.start("worker", loop)
    assert wait(lambda: supervisor.broken is not None)
    assert "thread worker crashed 4 times in 60s: ValueError: always" == supervisor.broken
    count = len(runs)
    threading.Event().wait(0.1)
    assert len(runs) == count == 4
    supervisor.close()


def test_crashes_outside_the_window_do_not_add_up():
    now = [0.0]
    runs = []
    supervisor = Supervisor(lambda name, error: now.__setitem__(0, now[0] + 100), max_restarts=1, window_s=60,
                            backoff_s=0.0, clock=lambda: now[0])  # fmt: skip

    def loop():
        runs.append(1)
        if len(runs) < 5:
            raise ValueError("rare")
        supervisor.stop.wait()

    supervisor.start("worker", loop)
    assert wait(lambda: len(runs) == 5)
    supervisor.close()
    assert supervisor.broken is None and supervisor.restarts == 4


def test_a_failing_crash_handler_does_not_stop_the_supervision():
    runs = []
    supervisor = Supervisor(lambda name, error: 1 / 0, backoff_s=0.0)

    def loop():
        runs.append(1)
        if len(runs) == 1:
            raise RuntimeError("first")
        supervisor.stop.wait()

    supervisor.start("worker", loop)
    assert wait(lambda: len(runs) == 2)
    supervisor.close()
