"""How one batch's compute is timed: warm-up calls, then repeated calls within a budget, keeping the minimum.

Validation's in-process measurement (`spark_cnn.perf_tools.validate`) and the sidecar's measuring process
(`spark_cnn.sidecar.measure`) both time through `time_batches`, so a module and a ModelRunner are timed alike.
No torch at import (only when settling the allocator): the CLI lists CLOCKS without loading
torch.

>>> ms, spread = time_batches(lambda: sum(range(1000)), repeats=3, warmup=1)
>>> ms > 0 and spread >= 0
True
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from spark_cnn.errors import ConfigError
from spark_cnn.imaging.preprocess import Preprocessing

__all__ = ["CLOCKS", "DEFAULT_BATCH_SIZES", "DEFAULT_POINT_BUDGET_S", "DEFAULT_REPEATS", "DEFAULT_SWEEPS",
           "DEFAULT_WARMUP", "MIN_REPEATS",
           "check_options", "preprocessing_for", "random_pixels", "settle_allocator", "time_batches", "timed"]

# What a time is read from. "wall": elapsed time, what a batch's latency is. "cpu": the calling thread's CPU
# time (user + system, so page faults count): the same as "wall" for one torch thread on an idle host, far
# steadier on a busy one (docs/perf-model.md, "Calibration").
CLOCKS: dict[str, Callable[[], float]] = {"wall": time.perf_counter, "cpu": time.thread_time}

# The batch sizes a latency curve is timed and predicted at: powers of two up to the largest batch a CPU
# sidecar is worth running.
DEFAULT_BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64)
# Passes over all batch sizes; each point keeps its best, and how much the passes disagree is the
# measurement's repeatability.
DEFAULT_SWEEPS = 2
# Warm-up: the first call at a new batch size builds oneDNN's kernels and the next ones still find the
# allocator unsettled, so 3 (docs/perf-model.md, "Validation").
DEFAULT_WARMUP = 3
# Timed calls per point, fewer when one call is long (at most DEFAULT_POINT_BUDGET_S of them), never fewer
# than MIN_REPEATS: heavy points (googlenet at batch 64 runs for 3 s on one core) get 2.
DEFAULT_REPEATS = 5
MIN_REPEATS = 2
DEFAULT_POINT_BUDGET_S = 4.0

# glibc raises its mmap threshold to the size of a freed mapped chunk, up to 32 MiB: tensors below it then come
# from the heap. A long-running sidecar gets there with its first large batch; a measuring process does so
# first, so that what it measures does not depend on what ran before (the time model assumes the same state).
SETTLE_BYTES = (32 << 20) - (16 << 10)


def settle_allocator() -> None:
    """Put glibc's malloc in the state of a process that has run large batches (CPU; harmless elsewhere)."""
    import torch  # here, not at import: see the module's docstring

    torch.empty(SETTLE_BYTES // 4).fill_(0.0)


def random_pixels(input_shape: Sequence[int], batch: int) -> np.ndarray:
    """A fixed batch of random uint8 NHWC pixels for images of `input_shape` (3, H, W)."""
    channels, height, width = input_shape
    if channels != 3:
        raise ConfigError(f"input_shape {tuple(input_shape)}: the sidecar feeds RGB images, (3, H, W)")
    return np.random.default_rng(0).integers(0, 256, (batch, height, width, 3), dtype=np.uint8)


def preprocessing_for(input_shape: Sequence[int]) -> Preprocessing:
    """The preprocessing that crops square images of `input_shape` to its size (the default otherwise)."""
    _, height, width = input_shape
    return Preprocessing(resize=max(height, width), crop=height) if height == width else Preprocessing()


def check_options(*, repeats: int, warmup: int, clock: str) -> None:
    """ConfigError unless `repeats` >= 1, `warmup` >= 0 and `clock` is one of CLOCKS."""
    if repeats < 1 or warmup < 0:
        raise ConfigError(f"repeats must be >= 1 and warmup >= 0, got repeats={repeats} warmup={warmup}")
    if clock not in CLOCKS:
        raise ConfigError(f"clock must be one of {', '.join(CLOCKS)}, got {clock!r}")


def timed(run: Callable[[], Any], clock: Callable[[], float] = time.perf_counter) -> float:
    """Seconds one call of `run` takes on `clock`."""
    start = clock()
    run()
    return clock() - start


def time_batches(run: Callable[[], Any], *, repeats: int = DEFAULT_REPEATS, warmup: int = DEFAULT_WARMUP,
                 point_budget_s: float | None = DEFAULT_POINT_BUDGET_S, clock: str = "wall") -> tuple[float, float]:
    """(minimum ms, spread) of `run()`: `warmup` untimed calls, then `repeats` timed ones, or fewer when they
    would take more than `point_budget_s` (at least MIN_REPEATS, or `repeats` if fewer). `spread` is
    (median - min) / min over the timed calls. `clock` is one of CLOCKS."""
    check_options(repeats=repeats, warmup=warmup, clock=clock)
    read = CLOCKS[clock]
    for _ in range(warmup):
        run()
    times = [timed(run, read)]
    if point_budget_s is not None:
        repeats = max(min(repeats, MIN_REPEATS), min(repeats, int(point_budget_s / max(times[0], 1e-9))))
    while len(times) < repeats:
        times.append(timed(run, read))
    times.sort()
    best = times[0]
    median = _median(times)
    return best * 1e3, max(median - best, 0.0) / best


def _median(ordered: list[float]) -> float:
    """The median of sorted values (the mean of the middle two for an even count, as numpy's)."""
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2
