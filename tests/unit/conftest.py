"""Unit tests start no process and do not sleep: both raise here, so a test that needs either lives in
tests/integration. Patterned on Ray Data's tests/unit/conftest.py.

The guard wraps each test's set-up, call and tear-down rather than being a fixture, so that fixtures of every
scope (a session fixture that calibrates, a module one that starts a sidecar) are held to it too."""

from __future__ import annotations

import contextlib
import multiprocessing.process
import os
import subprocess
import threading
import time

import pytest
import torch  # noqa: F401  (its import asks ldconfig for CUDA libraries: a process the tests do not start)

with contextlib.suppress(ImportError):  # the report's plot: its first import on a machine runs fc-list for a font cache
    import matplotlib.font_manager  # noqa: F401

_WHY = "unit tests start no process and do not sleep: move the test to tests/integration, or wait on an Event"


def _refuse(what: str, original, background: set[int]):
    def refused(*args, **kwargs):
        if threading.get_ident() in background:  # a thread older than the test (py4j's finalizer of an integration
            return original(*args, **kwargs)     # test's session in this worker): not the test's doing
        raise RuntimeError(f"{what} in a unit test; {_WHY}")
    return refused


@contextlib.contextmanager
def _no_process_no_sleep():
    background = {thread.ident for thread in threading.enumerate() if thread is not threading.current_thread()}
    with pytest.MonkeyPatch.context() as mp:
        def refuse(owner, name: str, what: str) -> None:
            mp.setattr(owner, name, _refuse(what, getattr(owner, name), background))

        refuse(subprocess.Popen, "__init__", "subprocess.Popen")
        refuse(multiprocessing.process.BaseProcess, "start", "multiprocessing start")
        for name in ("fork", "forkpty", "posix_spawn", "posix_spawnp"):
            if hasattr(os, name):
                refuse(os, name, f"os.{name}")
        refuse(time, "sleep", "time.sleep")
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
