"""The unit tests' guard (tests/unit/conftest.py) refuses a sleep or a process to the test and the threads it
starts, not to threads that were running before it (py4j's finalizer of an integration test's Spark session in
the same worker once died of it, and with it that session's finalizers)."""

from __future__ import annotations

import threading
import time

import pytest

_go = threading.Event()
_slept: list[bool] = []


def _older_than_the_tests() -> None:
    _go.wait()
    time.sleep(0.001)
    _slept.append(True)


_older = threading.Thread(target=_older_than_the_tests, name="older-than-the-tests", daemon=True)
_older.start()  # at collection, outside every test's guard


def test_a_thread_older_than_the_test_may_sleep():
    _go.set()
    _older.join(timeout=30)
    assert _slept == [True]


def test_the_test_may_not_sleep():
    with pytest.raises(RuntimeError, match="time.sleep in a unit test"):
        time.sleep(0.001)


def test_a_thread_the_test_starts_may_not_sleep():
    refused: list[Exception] = []

    def sleeper() -> None:
        try:
            time.sleep(0.001)
        except RuntimeError as e:
            refused.append(e)
    thread = threading.Thread(target=sleeper)
    thread.start()
    thread.join(timeout=30)
    assert len(refused) == 1
