"""Unit tests start no process and do not sleep: both raise here, so a test that needs either lives in
tests/integration. Patterned on Ray Data's tests/unit/conftest.py.

The guard wraps each test's set-up, call and tear-down rather than being a fixture, so that fixtures of every
scope (a session fixture that calibrates, a module one that starts a sidecar) are held to it too."""

from __future__ import annotations

import contextlib
import multiprocessing.process
import os
import subprocess
import time

import pytest
import torch  # noqa: F401  (its import asks ldconfig for CUDA libraries: a process the tests do not start)

with contextlib.suppress(ImportError):  # the report's plot: its first import on a machine runs fc-list for a font cache
    import matplotlib.font_manager  # noqa: F401

_WHY = "unit tests start no process and do not sleep: move the test to tests/integration, or wait on an Event"


def _refuse(what: str):
    def refused(*args, **kwargs):
        raise RuntimeError(f"{what} in a unit test; {_WHY}")
    return refused


@contextlib.contextmanager
def _no_process_no_sleep():
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(subprocess.Popen, "__init__", _refuse("subprocess.Popen"))
        mp.setattr(multiprocessing.process.BaseProcess, "start", _refuse("multiprocessing start"))
        for name in ("fork", "forkpty", "posix_spawn", "posix_spawnp"):
            if hasattr(os, name):
                mp.setattr(os, name, _refuse(f"os.{name}"))
        mp.setattr(time, "sleep", _refuse("time.sleep"))
        yield


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item):
    with _no_process_no_sleep():
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    with _no_process_no_sleep():
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item, nextitem):
    # The session's last teardown also finalizes session fixtures of other folders (an integration Spark session
    # stopping its sidecars): those are not the unit test's.
    with _no_process_no_sleep() if nextitem is not None else contextlib.nullcontext():
        return (yield)
