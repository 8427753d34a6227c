"""Choose a batch size from a latency curve.

Pure functions over plain numbers: the curve may come from the analytical model (perf/timemodel.py) or from
measurements. The running sidecar corrects the choice from measured batches (sidecar/online_tuner.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from spark_cnn.errors import ConfigError

MODES = ("performance", "memory")
# Performance mode takes the smallest batch within 3% of the best throughput: bigger batches cost memory and
# latency for gains smaller than the noise of a shared machine.
PERFORMANCE_TOLERANCE = 0.03
# Memory-efficient mode takes the smallest batch reaching 90% of the best throughput.
MEMORY_MODE_FRACTION = 0.90


@dataclass(frozen=True)
class CurvePoint:
    """One batch size on a latency curve: per-batch latency and peak device memory."""

    batch_size: int
    latency_ms: float
    peak_memory_bytes: int = 0

    @property
    def images_per_s(self) -> float:
        return 1000.0 * self.batch_size / self.latency_ms


@dataclass(frozen=True)
class Choice:
    batch_size: int
    images_per_s: float
    best_images_per_s: float
    reason: str


def choose_batch_size(points: list[CurvePoint], *, mode: str = "performance", memory_budget_bytes: int | None = None,
                      max_latency_ms: float | None = None) -> Choice:
    """The batch size the mode asks for among points within the memory budget and latency bound.

    >>> curve = [CurvePoint(1, 10.0), CurvePoint(8, 40.0), CurvePoint(16, 79.0), CurvePoint(32, 200.0)]
    >>> choose_batch_size(curve).batch_size   # 16 is best (202.5 img/s); 8 (200) is within 3%
    8
    """
    if mode not in MODES:
        raise ConfigError(f"--tuning {mode}: expected one of {', '.join(MODES)}")
    if not points:
        raise ConfigError("no batch sizes to choose from")
    feasible = [p for p in points
                if (memory_budget_bytes is None or p.peak_memory_bytes <= memory_budget_bytes)
                and (max_latency_ms is None or p.latency_ms <= max_latency_ms)]
    if not feasible:
        smallest = min(points, key=lambda p: p.batch_size)
        raise ConfigError(f"no batch size fits: batch {smallest.batch_size} needs {smallest.latency_ms:.1f} ms and "
                          f"{smallest.peak_memory_bytes / 2**20:.0f} MiB; raise the latency bound or memory budget")
    best = max(p.images_per_s for p in feasible)
    fraction = 1.0 - PERFORMANCE_TOLERANCE if mode == "performance" else MEMORY_MODE_FRACTION
    pick = min((p for p in feasible if p.images_per_s >= fraction * best), key=lambda p: p.batch_size)
    reason = (f"smallest batch within {100 * (1 - fraction):.0f}% of the best throughput ({best:.1f} img/s)"
              f" among {len(feasible)} feasible of {len(points)} sizes")
    return Choice(pick.batch_size, pick.images_per_s, best, reason)
