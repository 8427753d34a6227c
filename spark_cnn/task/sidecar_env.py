"""The process environment a sidecar runs with: glibc malloc settings and its torch thread count, and how to tell
which malloc settings a process has. Torch-free: the launcher (inside Spark tasks) and offline calibration import it.

With glibc's defaults, torch's CPU tensors above the dynamic mmap threshold (at most 32 MiB) are mapped afresh
on every call and the heap top is trimmed back to the kernel, so every batch faults fresh pages (about half of
a batch's time for mobilenet_v2: docs/perf-model-journal.md). A sidecar runs the same shapes again and again, so it
keeps freed memory: its resident size stays at its largest batch's peak.

- MALLOC_MMAP_MAX_=0: never mmap an allocation; everything comes from the heap and is reused.
- MALLOC_TRIM_THRESHOLD_=16 GiB: never give the heap top back (that would fault it in again next batch).
- MALLOC_TOP_PAD_=256 MiB: grow the heap in large steps, so the first large batches fault fewer times.
- MALLOC_ARENA_MAX=1: one arena for all threads. The sidecar computes in service threads, and a thread's own
  arena lives in 64 MiB mmapped heaps that glibc still unmaps and re-maps; torch allocates a few large blocks
  per layer, so one arena's lock costs nothing measurable.

glibc reads these variables once, when the process starts: they must be in the environment the process is
started with (spark_cnn.task.launcher does so; validation's fresh processes too). The time model predicts
for a process with these settings unless told otherwise (spark_cnn.perf.timemodel, `allocator`).
"""

from __future__ import annotations

import os
import platform
from collections.abc import Mapping

__all__ = ["GLIBC", "RETAINED", "SIDECAR_MALLOC_ENV", "allocator_of", "cpu_threads", "sidecar_environment"]

SIDECAR_MALLOC_ENV = {
    "MALLOC_ARENA_MAX": "1",
    "MALLOC_MMAP_MAX_": "0",
    "MALLOC_TRIM_THRESHOLD_": str(16 << 30),
    "MALLOC_TOP_PAD_": str(256 << 20),
}
# The two allocator behaviours the time model knows: freed memory kept for reuse (SIDECAR_MALLOC_ENV), or
# glibc's defaults (large tensors mapped per call, heap trimmed).
RETAINED = "retained"
GLIBC = "glibc"
# A trim threshold at least this large never trims a CNN's heap in practice.
_NEVER_TRIM_BYTES = 1 << 30


def sidecar_environment(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """`base` (default: this process's environment) plus SIDECAR_MALLOC_ENV; a variable the user already set
    keeps the user's value."""
    env = dict(os.environ if base is None else base)
    for name, value in SIDECAR_MALLOC_ENV.items():
        env.setdefault(name, value)
    return env


def allocator_of(env: Mapping[str, str] | None = None) -> str:
    """RETAINED when `env` (default: this process's, as it started) keeps freed memory — mmap off, trim off —
    on a glibc system, else GLIBC.

    >>> allocator_of(sidecar_environment({})) == RETAINED or platform.libc_ver()[0] != "glibc"
    True
    >>> allocator_of({})
    'glibc'
    """
    env = os.environ if env is None else env
    if platform.libc_ver()[0] != "glibc":
        return GLIBC
    return RETAINED if env.get("MALLOC_MMAP_MAX_") == "0" and _int(env.get("MALLOC_TRIM_THRESHOLD_")) >= \
        _NEVER_TRIM_BYTES else GLIBC


def _int(text: str | None) -> int:
    try:
        return int(text or 0)
    except ValueError:
        return 0


def cpu_threads(requested: int | None) -> int:
    """Torch threads for a CPU sidecar: as asked, else half the cores.

    The sidecar shares its cores with the tasks that decode for it: OpenMP's parallel regions stall whenever
    another process takes one of their cores, so fewer threads serve more images (docs/benchmarks.md).
    """
    return requested or max(1, (os.cpu_count() or 2) // 2)
