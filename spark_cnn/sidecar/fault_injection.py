"""Fault injection for reliability tests: off unless an environment variable of the sidecar turns it on.

Job options cannot set any of these: a sidecar inherits them only from the environment of the process that
starts it (a test's). Unset (the default), nothing changes; the sidecar logs a warning when one is set. The
forward faults wrap a runner once, where models load (`with_injected_faults`), so the forward path itself never
checks them.

- `SPARK_CNN_INJECT_OOM_ABOVE_ROWS=N`: every device batch of more than N rows fails with the device's
  out-of-memory error before the model runs, as a GPU too small for that batch would. The sidecar then halves
  its batches (service.py) until they fit, so a job's output is unchanged: tests/e2e/test_faults.py shows it.
- `SPARK_CNN_INJECT_MODEL_FAULT=raise|sticky`: every forward raises, as a broken model does (`raise`), or with
  the text of a CUDA error that leaves the device unusable (`sticky`, e.g. an illegal memory access).
- `SPARK_CNN_INJECT_START_DELAY_S=S`: the sidecar sleeps S seconds before it publishes its info file, as one
  loading a large model on a busy host does.
- `SPARK_CNN_INJECT_START_KILLS=FILE`: FILE holds a count; while it is above 0, a starting sidecar lowers it by
  one and SIGKILLs itself before it publishes its info file, as the OOM killer does.
"""

from __future__ import annotations

import fcntl
import logging
import os
import signal

import torch

from spark_cnn.errors import ConfigError

log = logging.getLogger("spark_cnn.sidecar")

INJECT_OOM_ENV = "SPARK_CNN_INJECT_OOM_ABOVE_ROWS"
INJECT_MODEL_FAULT_ENV = "SPARK_CNN_INJECT_MODEL_FAULT"
INJECT_START_DELAY_ENV = "SPARK_CNN_INJECT_START_DELAY_S"
INJECT_START_KILLS_ENV = "SPARK_CNN_INJECT_START_KILLS"
MODEL_FAULTS = ("raise", "sticky")
# The text CUDA gives an error after which the context is unusable; runner.failure_kind reads it as sticky.
STICKY_FAULT_TEXT = "CUDA error: an illegal memory access was encountered"


def injected_oom_above_rows() -> int | None:
    """The batch size above which out-of-memory is injected, or None (no injection)."""
    text = os.environ.get(INJECT_OOM_ENV, "").strip()
    if not text:
        return None
    try:
        rows = int(text)
    except ValueError:
        rows = 0
    if rows < 1:
        raise ConfigError(f"{INJECT_OOM_ENV}={text!r}: expected a positive number of rows (or unset it)")
    return rows


def injected_model_fault() -> str | None:
    """`raise`, `sticky` or None (no injection)."""
    text = os.environ.get(INJECT_MODEL_FAULT_ENV, "").strip()
    if not text:
        return None
    if text not in MODEL_FAULTS:
        raise ConfigError(f"{INJECT_MODEL_FAULT_ENV}={text!r}: expected one of {', '.join(MODEL_FAULTS)} (or unset it)")
    return text


def model_fault_error(fault: str) -> RuntimeError:
    """The error an injected model fault raises from a forward."""
    if fault == "sticky":
        return RuntimeError(f"{STICKY_FAULT_TEXT} (injected by {INJECT_MODEL_FAULT_ENV})")
    return RuntimeError(f"the model failed (injected by {INJECT_MODEL_FAULT_ENV})")


def with_injected_faults(runner):
    """`runner` itself when no forward fault is set (real use), else a wrapper whose forward fails as set."""
    oom_above, fault = injected_oom_above_rows(), injected_model_fault()
    if oom_above is None and fault is None:
        return runner
    if fault is not None:
        log.warning("fault injection on (%s=%s): every forward fails", INJECT_MODEL_FAULT_ENV, fault)
    if oom_above is not None:
        log.warning("fault injection on (%s): batches of more than %d rows fail with out-of-memory",
                    INJECT_OOM_ENV, oom_above)
    return FaultInjectingRunner(runner, oom_above, fault)


class FaultInjectingRunner:
    """A ModelRunner whose forward fails as the injection variables say; everything else is the runner's own."""

    def __init__(self, runner, oom_above: int | None, fault: str | None):
        self._runner = runner
        self._oom_above = oom_above
        self._fault = fault

    def __getattr__(self, name: str):
        return getattr(self._runner, name)

    def forward(self, staged):
        if self._oom_above is not None and len(staged.pixels) > self._oom_above:
            raise torch.OutOfMemoryError(f"out of memory (injected by {INJECT_OOM_ENV} at {len(staged.pixels)} rows)")
        if self._fault is not None:
            raise model_fault_error(self._fault)
        return self._runner.forward(staged)

    def run(self, pixels):
        """The runner's three stages, through the failing forward."""
        return self.download(self.forward(self.upload(pixels)))


def injected_start_faults() -> list[str]:
    """Apply the start faults that are set (sleep; SIGKILL while the count lasts); what was applied, for the log."""
    applied = []
    delay = os.environ.get(INJECT_START_DELAY_ENV, "").strip()
    if delay:
        import time

        applied.append(f"{INJECT_START_DELAY_ENV}={delay}")
        time.sleep(float(delay))
    counter = os.environ.get(INJECT_START_KILLS_ENV, "").strip()
    if counter and _take_one(counter):
        os.kill(os.getpid(), signal.SIGKILL)
    return applied


def _take_one(path: str) -> bool:
    """Lower the count in `path` by one if it is above 0 (under a lock: sidecars may start side by side)."""
    try:
        with open(path, "r+") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            left = int(f.read().strip() or 0)
            if left <= 0:
                return False
            f.seek(0)
            f.truncate()
            f.write(str(left - 1))
            f.flush()
            return True
    except (OSError, ValueError):
        return False
