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
# A noisy calibration's spread widens that band (its predictions cannot tell such batches apart), never past
# 5%: the pick's target is 95% of the best measured throughput, and a wider band would give it up by design.
MAX_NOISE_TOLERANCE = 0.05
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
                      max_latency_ms: float | None = None, noise: float = 0.0) -> Choice:
    """The batch size the mode asks for among points within the memory budget and latency bound. `noise`
    (a noisy calibration's relative spread, DeviceProfile.tuning_noise) widens performance mode's band of ties
    up to MAX_NOISE_TOLERANCE.

    >>> curve = [CurvePoint(1, 10.0), CurvePoint(8, 40.0), CurvePoint(16, 79.0), CurvePoint(32, 200.0)]
    >>> choose_batch_size(curve).batch_size   # 16 is best (202.5 img/s); 8 (200) is within 3%
    8
    >>> choose_batch_size(curve[:1] + [CurvePoint(8, 41.0), CurvePoint(16, 79.0)], noise=0.12).batch_size
    8
    """
    if mode not in MODES:
        raise ConfigError(f"--tuning {mode}: expected one of {', '.join(MODES)}")
    if not points:
        raise ConfigError("no batch sizes to choose from")
    if not 0.0 <= noise < 1.0:
        raise ConfigError(f"noise {noise!r}: expected a relative spread in [0, 1)")
    feasible = [p for p in points
                if (memory_budget_bytes is None or p.peak_memory_bytes <= memory_budget_bytes)
                and (max_latency_ms is None or p.latency_ms <= max_latency_ms)]
    if not feasible:
        smallest = min(points, key=lambda p: p.batch_size)
        raise ConfigError(f"no batch size fits: batch {smallest.batch_size} needs {smallest.latency_ms:.1f} ms and "
                          f"{smallest.peak_memory_bytes / 2**20:.0f} MiB; raise the latency bound or memory budget")
    best = max(p.images_per_s for p in feasible)
    tolerance = max(PERFORMANCE_TOLERANCE, min(noise, MAX_NOISE_TOLERANCE))
    fraction = 1.0 - tolerance if mode == "performance" else MEMORY_MODE_FRACTION
    pick = min((p for p in feasible if p.images_per_s >= fraction * best), key=lambda p: p.batch_size)
    noisy = f" (the calibration's noise: +-{100 * noise:.0f}%)" if mode == "performance" and noise > 0 else ""
    reason = (f"smallest batch within {100 * (1 - fraction):.0f}% of the best throughput ({best:.1f} img/s){noisy}"
              f" among {len(feasible)} feasible of {len(points)} sizes")
    return Choice(pick.batch_size, pick.images_per_s, best, reason)
