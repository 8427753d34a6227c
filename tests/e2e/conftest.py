"""End-to-end tests run the real commands in subprocesses, as a user would."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

# A job that has not finished in this time is stuck; the suite must end either way.
JOB_TIMEOUT_S = 300
BIN = os.path.dirname(sys.executable)


# The commands here start Spark JVMs that live a minute or less: the quick compiler alone and one GC thread suit
# them. spark-submit adds SPARK_SUBMIT_OPTS to the driver JVM's options and prints nothing about it (the JDK's own
# option variables add a line to every command's stderr). Measured (two whole-suite runs, 2-core AMD host): the
# command tests ran 5-15 s faster each (the e2e bench 102 -> 88 s), while the long-lived in-process sessions of
# tests/integration ran slower, so only this layer sets it. Jobs outside tests keep the JVM's defaults.
SHORT_LIVED_JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


@pytest.fixture(scope="package", autouse=True)
def short_lived_spark_jvms():
    """SPARK_SUBMIT_OPTS for this layer's driver JVMs (commands inherit it), unless the caller set it."""
    if "SPARK_SUBMIT_OPTS" in os.environ:
        yield os.environ["SPARK_SUBMIT_OPTS"]
        return
    os.environ["SPARK_SUBMIT_OPTS"] = SHORT_LIVED_JVM_OPTIONS
    try:
        yield SHORT_LIVED_JVM_OPTIONS
    finally:
        os.environ.pop("SPARK_SUBMIT_OPTS", None)


# A sidecar exits within seconds of its driver or executor; on a loaded machine (two test workers) it can take longer.
SIDECAR_EXIT_WAIT_S = 30


def sidecars_now() -> set[int]:
    """Pids of the live sidecars in this test process's runtime directory."""
    from spark_cnn.task.launcher import find_sidecars

    return {s.pid for s in find_sidecars()}


def sidecars_left_since(before: set[int], timeout_s: float = SIDECAR_EXIT_WAIT_S) -> set[int]:
    """Sidecars started since `before` was taken that are still alive after waiting up to `timeout_s` for them
    to exit. A test compares against its own snapshot: sidecars of other tests' in-process sessions, alive while
    their session is, are not its business."""
    deadline = time.monotonic() + timeout_s
    while (left := sidecars_now() - before) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def run_command(args: list[str], **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(args, capture_output=True, text=True, timeout=JOB_TIMEOUT_S, **kwargs)


@pytest.fixture
def spark_cnn():
    """Run `spark-cnn ARGS...` from this environment; returns the CompletedProcess."""
    return lambda *args: run_command([os.path.join(BIN, "spark-cnn"), *args])
