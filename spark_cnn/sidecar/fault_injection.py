"""Fault injection for reliability tests: off unless an environment variable of the sidecar turns it on.

`SPARK_CNN_INJECT_OOM_ABOVE_ROWS=N`: every device batch of more than N rows fails with the device's
out-of-memory error before the model runs, as a GPU too small for that batch would. The sidecar then halves
its batches (service.py) until they fit, so a job's output is unchanged: tests/e2e/test_faults.py shows it.
Unset (the default), nothing changes; the sidecar logs a warning at start when it is set.
"""

from __future__ import annotations

import os

from spark_cnn.errors import ConfigError

INJECT_OOM_ENV = "SPARK_CNN_INJECT_OOM_ABOVE_ROWS"


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
