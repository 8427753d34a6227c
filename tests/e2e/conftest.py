"""End-to-end tests run the real commands in subprocesses, as a user would."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

# A job that has not finished in this time is stuck; the suite must end either way.
JOB_TIMEOUT_S = 300
BIN = os.path.dirname(sys.executable)


def run_command(args: list[str], **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(args, capture_output=True, text=True, timeout=JOB_TIMEOUT_S, **kwargs)


@pytest.fixture
def spark_cnn():
    """Run `spark-cnn ARGS...` from this environment; returns the CompletedProcess."""
    return lambda *args: run_command([os.path.join(BIN, "spark-cnn"), *args])
