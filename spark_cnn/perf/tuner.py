"""Choose a batch size from a latency curve, and correct the choice online from measured batch times.

Pure functions and small classes over plain numbers: the curve may come from the analytical model
(perf/timemodel.py) or from measurements; the sidecar feeds `OnlineTuner` the batch times it observes.
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


class OnlineTuner:
    """Corrects the starting batch size from measured batch times, by trying neighbours (hill climbing).

    A model's error is partly a scale factor, which does not move the best batch size; what matters is the
    shape of the curve, and that is measured here. After `window` full batches at the current size the tuner
    tries double the size, and moves there if it gives more images per second by more than `tolerance`, then
    keeps climbing; when a step up does not win it tries half the size the same way; when neither wins it
    settles. Only full batches count: partial ones mean the clients, not the device, set the pace.

    >>> t = OnlineTuner(start=8, window=2, max_size=32)
    >>> for ms in (40, 40): t.observe(8, ms)
    >>> t.target  # trying 16
    16
    >>> for ms in (100, 100): t.observe(16, ms)   # 160 img/s < 200 img/s at 8: try 4 instead
    >>> t.target
    4
    >>> for ms in (30, 30): t.observe(4, ms)      # 133 img/s: 8 stays
    >>> t.target, t.settled
    (8, True)
    """

    def __init__(self, start: int, *, window: int = 20, max_size: int = 512, min_size: int = 1,
                 tolerance: float = PERFORMANCE_TOLERANCE, predicted: dict[int, float] | None = None):
        if not min_size <= start <= max_size:
            raise ValueError(f"start {start} outside [{min_size}, {max_size}]")
        self.target = start
        self.window = window
        self.max_size = max_size
        self.min_size = min_size
        self.tolerance = tolerance
        self.observed: dict[int, list[float]] = {}   # batch size -> measured ms of full batches
        self.predicted = predicted or {}              # batch size -> images/s the analytical model expected
        self.start = start
        self.settled = False
        self._home = start     # the best size so far
        self._going = "up"     # doubling first; halving once doubling stops winning

    def rate(self, size: int) -> float | None:
        """Measured images/s at `size` (median batch time), or None before a full window."""
        times = self.observed.get(size, [])
        if len(times) < self.window:
            return None
        return 1000.0 * size / sorted(times)[len(times) // 2]

    def observe(self, size: int, ms: float) -> None:
        """One full batch of `size` rows took `ms` on the device."""
        if self.settled or size != self.target or ms <= 0:
            return
        self.observed.setdefault(size, []).append(ms)
        if len(self.observed[size]) == self.window:
            self._next()

    def _next(self) -> None:
        if self.target != self._home:  # a trial has finished
            if self.rate(self.target) > self.rate(self._home) * (1 + self.tolerance):
                self._home = self.target  # move there and keep going the same way
            elif self._going == "up":
                self._going = "down"      # a step up did not win: try the other way
            else:
                return self._settle()
        while True:
            following = self._home * 2 if self._going == "up" else self._home // 2
            if self.min_size <= following <= self.max_size and following not in self.observed:
                self.target = following
                return
            if self._going == "down":
                return self._settle()
            self._going = "down"

    def _settle(self) -> None:
        self.target = self._home
        self.settled = True

    def summary(self) -> dict:
        summary = {"start": self.start, "target": self.target, "settled": self.settled,
                   "observed_images_per_s": {str(s): round(r, 1) for s in sorted(self.observed)
                                             if (r := self.rate(s)) is not None}}
        if self.predicted:
            summary["predicted_images_per_s"] = {str(s): r for s, r in sorted(self.predicted.items())}
        return summary
