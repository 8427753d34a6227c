"""Sidecar processes without Spark: a sleeping child process plays the executor JVM a sidecar watches, and
replies are checked against the demo CNN computed directly with torch.

Every `fake_app` stops what it started and checks that no sidecar process of its application id is left.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from spark_cnn.models.digits import DIGITS_PREPROCESSING
from spark_cnn.task.launcher import RUNTIME_DIR_ENV, LaunchOptions, sidecar_name, stop_sidecars
from spark_cnn.task.procs import ExecutorProcess, ProcessId, cmdline, is_alive, process_id

# The sidecar checks its executor and idle timer every 0.5 s; 10 s leaves room for a loaded 2-core host.
EXIT_WAIT_S = 10.0
PIXEL_SHAPE = DIGITS_PREPROCESSING.pixel_shape  # (32, 32, 3)
LOGITS_ATOL = 1e-5


@dataclass(frozen=True)
class FakeApp:
    """An application id and the sleeping child process that plays its executor JVM."""

    app_id: str
    executor: ExecutorProcess
    child: subprocess.Popen

    def options(self, **overrides) -> LaunchOptions:
        return LaunchOptions(app_id=self.app_id, **{"device": "cpu", **overrides})

    def base(self, device: str = "cpu") -> str:
        """The launcher's path prefix for this app's sidecar files (.sock, .json, .lock, .log)."""
        return os.path.join(os.environ[RUNTIME_DIR_ENV], sidecar_name(self.app_id, self.executor, device))


def sidecar_pids(app_id: str) -> list[int]:
    """Live `python -m spark_cnn.sidecar ... --app-id <app_id>` processes, found through /proc (not info files)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        args = cmdline(int(entry))
        if (args[1:3] == ["-m", "spark_cnn.sidecar"] and "--app-id" in args
                and args[args.index("--app-id") + 1] == app_id and is_alive(ProcessId(int(entry), 0))):
            found.append(int(entry))
    return found


def wait_until(condition, timeout_s: float = EXIT_WAIT_S) -> float | None:
    """Seconds until `condition()` held, or None if it did not within `timeout_s`."""
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        if condition():
            return time.monotonic() - started
        time.sleep(0.05)
    return None


def gone(pid: int) -> bool:
    return not is_alive(ProcessId(pid, 0))


@contextmanager
def fake_app(tag: str) -> Iterator[FakeApp]:
    """A fresh app id and fake executor; afterwards its sidecars are stopped and none may remain."""
    app_id = f"scn-{tag}-{uuid.uuid4().hex[:8]}"
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        yield FakeApp(app_id, ExecutorProcess(process_id(child.pid), "exec-test"), child)
    finally:
        # Stop first, then kill the executor, so that a sidecar still running is ended by stop_sidecars itself
        # rather than racing it on its way out.
        try:
            stop_sidecars(app_id)
        finally:
            child.kill()
            child.wait()
            for pid in sidecar_pids(app_id):  # last resort, so that a failed test leaves no process behind
                with suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        assert wait_until(lambda: not sidecar_pids(app_id)) is not None, f"sidecars of {app_id} still running"


def random_pixels(rng: np.random.Generator, rows: int) -> np.ndarray:
    return rng.integers(0, 256, size=(rows, *PIXEL_SHAPE), dtype=np.uint8)


def logits_of(batch: pa.RecordBatch) -> np.ndarray:
    return batch.column("logits").flatten().to_numpy().reshape(batch.num_rows, -1)


def check_against_reference(reference, pixels: np.ndarray, reply) -> None:
    assert isinstance(reply, pa.RecordBatch), f"expected outputs, got {reply!r}"
    assert reply.num_rows == len(pixels)
    expected = reference(pixels)
    np.testing.assert_allclose(logits_of(reply), expected, atol=LOGITS_ATOL, rtol=0)
    np.testing.assert_array_equal(reply.column("label").to_numpy(), expected.argmax(axis=1))
