"""Faults of a real sidecar process that must fail the task, or must not: a model that raises, a sticky device
error, a sidecar killed while it starts, a task killed while its sidecar starts.

Faults come from the sidecar's fault-injection variables (sidecar/fault_injection.py), which it inherits from
the test's environment. The figures asserted are the ones docs/RELIABILITY.md states.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from spark_cnn.errors import SidecarError
from spark_cnn.sidecar.fault_injection import (
    INJECT_MODEL_FAULT_ENV,
    INJECT_START_DELAY_ENV,
    INJECT_START_KILLS_ENV,
)
from spark_cnn.task.client import SidecarClient, SidecarFault, map_ordered
from spark_cnn.task.failover import FailoverClient
from spark_cnn.task.launcher import ensure_sidecar
from spark_cnn.task.protocol import ErrorKind
from tests.sidecar_harness import check_against_reference, gone, random_pixels, sidecar_pids, wait_until

pytestmark = pytest.mark.slow

# A new sidecar (import torch) on a loaded 2-core host: ~3-10 s; starting one takes at most this long here.
START_BOUND_S = 60.0
# The injected slow start: long enough for the test to kill the task that started it mid-start.
SLOW_START_S = 6.0


def _connector(app, endpoint, job: str):
    def connect() -> SidecarClient:  # as task/stream.py connects
        info = ensure_sidecar(app.options(), app.executor)
        return SidecarClient(info.socket, info.token, endpoint, job, pid=info.pid)
    return connect


def test_a_model_that_raises_fails_the_task_and_the_sidecar_serves_on(app, endpoint, monkeypatch):
    monkeypatch.setenv(INJECT_MODEL_FAULT_ENV, "raise")
    pixels = random_pixels(np.random.default_rng(20), 3)

    with FailoverClient(_connector(app, endpoint, "model-fault")) as client:
        pid = client.ready["pid"]
        with pytest.raises(SidecarFault) as raised:
            list(map_ordered(client, [("a", pixels), ("b", pixels)]))

    message = str(raised.value)
    print(f"\nmodel fault: {message}")
    assert raised.value.kind == ErrorKind.MODEL and "\n" not in message
    assert message.startswith(f"model failure in the sidecar pid {pid} at ")
    assert "RuntimeError: the model failed (injected by SPARK_CNN_INJECT_MODEL_FAULT)" in message
    assert not gone(pid), "a model fault must not end the sidecar"


def test_a_sticky_device_error_fails_the_task_and_the_retry_gets_a_new_sidecar(app, endpoint, reference,
                                                                               monkeypatch):
    monkeypatch.setenv(INJECT_MODEL_FAULT_ENV, "sticky")
    pixels = random_pixels(np.random.default_rng(21), 3)

    with FailoverClient(_connector(app, endpoint, "sticky")) as client:
        first = client.ready["pid"]
        with pytest.raises(SidecarFault) as raised:
            list(map_ordered(client, [("a", pixels)]))

    message = str(raised.value)
    print(f"\nsticky device error: {message}")
    assert raised.value.kind == ErrorKind.STICKY and "illegal memory access" in message
    assert "the sidecar is stopped so that the task's retry starts a new one" in message
    assert wait_until(lambda: gone(first)) is not None, "the sidecar with an unusable device still runs"
    with open(app.base() + ".log") as f:
        assert "retiring: the device is unusable" in f.read()

    monkeypatch.delenv(INJECT_MODEL_FAULT_ENV)  # the retry's device works
    with FailoverClient(_connector(app, endpoint, "sticky-retry")) as client:
        [(_, reply)] = list(map_ordered(client, [("retry", pixels)]))
        assert client.ready["pid"] != first
    check_against_reference(reference, pixels, reply)


def test_a_sidecar_killed_while_starting_is_started_again_within_the_bound(app, endpoint, reference, monkeypatch,
                                                                          tmp_path):
    kills = tmp_path / "kills"
    kills.write_text("1")
    monkeypatch.setenv(INJECT_START_KILLS_ENV, str(kills))  # the first start SIGKILLs itself, as the OOM killer
    pixels = random_pixels(np.random.default_rng(22), 2)

    with FailoverClient(_connector(app, endpoint, "killed-start")) as client:
        [(_, reply)] = list(map_ordered(client, [("a", pixels)]))
    check_against_reference(reference, pixels, reply)
    assert kills.read_text() == "0"

    # One that is killed at every start: the task fails after the bound, naming why.
    kills.write_text("100")
    os.kill(client.ready["pid"], signal.SIGKILL)
    assert wait_until(lambda: gone(client.ready["pid"])) is not None
    with pytest.raises(SidecarError) as raised:
        FailoverClient(_connector(app, endpoint, "killed-always"), max_reconnects=1)
    print(f"\nkilled at every start: {raised.value}")
    assert "gave up after 2 attempts" in str(raised.value)
    assert "killed by signal 9 while starting" in str(raised.value)
    assert kills.read_text() == "98"


TASK = """
import sys
from spark_cnn.task.launcher import LaunchOptions, ensure_sidecar
from spark_cnn.task.procs import ExecutorProcess, ProcessId
ensure_sidecar(LaunchOptions(app_id=sys.argv[1], device="cpu"),
               ExecutorProcess(ProcessId(int(sys.argv[2]), int(sys.argv[3])), "exec-test"))
"""


def test_a_task_killed_while_its_sidecar_starts_leaves_one_sidecar_that_the_next_task_uses(app):
    env = {**os.environ, INJECT_START_DELAY_ENV: str(SLOW_START_S)}
    task = subprocess.Popen([sys.executable, "-c", TASK, app.app_id, str(app.executor.process.pid),
                             str(app.executor.process.start_time)], env=env)
    try:
        assert wait_until(lambda: sidecar_pids(app.app_id), START_BOUND_S) is not None, "no sidecar started"
        [starting] = sidecar_pids(app.app_id)
        task.kill()  # the task dies while its sidecar starts (sleeps before publishing its info file)
        task.wait()
        assert not os.path.exists(app.base() + ".json"), "the sidecar published its info file too soon"

        began = time.monotonic()
        info = ensure_sidecar(app.options(), app.executor)  # the next task: waits for that sidecar, uses it
        waited = time.monotonic() - began
    finally:
        task.kill()
        task.wait()

    print(f"\ntask killed mid-start: the next task waited {waited:.1f} s and used pid {info.pid}")
    assert info.pid == starting
    assert sidecar_pids(app.app_id) == [starting], "a second sidecar started beside the first"
