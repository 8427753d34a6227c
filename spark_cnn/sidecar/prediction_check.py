"""Whether a sidecar's measured batch times agree with what the device profile predicted (pure: numbers in).

The service feeds every full batch's time; the check compares them with the prediction in windows of
WINDOW batches and gives its verdict once SUSTAINED windows in a row disagree the same way:

- **faster than predicted**: the profile is pessimistic. A batch's measured time also holds the waits after
  its compute (copies, replies in order), so it can only overstate the device's time: a device this much faster
  than its profile says was calibrated under load (another job on the same cores). The server marks the cached
  profile stale, so the next calibration measures again and later jobs stop starting from it.
- **slower than predicted**: reported only. The job's own work slows its batches (tasks decoding on the same
  cores, a neighbour), and a calibration made now, on the busy host, would be the poisoned one.

Either way the job summary says so (`summary()`, in each sidecar's entry).
"""

from __future__ import annotations

import math

__all__ = ["DISAGREE_BOUND", "FASTER", "NOISE_FACTOR", "SLOWER", "SUSTAINED", "WINDOW", "PredictionCheck"]

# Full batches per window: enough for a median and quartiles, few enough to judge a job of a few hundred batches.
WINDOW = 20
# A window disagrees when its median measured/predicted ratio is off by more than this: above the model's worst
# error on networks it was not calibrated on (about 28%, predicted too slow: docs/perf-model-journal.md), below what a
# busy-host calibration caused (googlenet 38.9%).
DISAGREE_BOUND = 0.35
# ... or by more than this many times the window's own spread (interquartile range over median), so a jittery
# job does not count as a disagreement.
NOISE_FACTOR = 3.0
# Windows in a row that must disagree the same way before the check says so: one bad moment is not a verdict.
SUSTAINED = 3
FASTER, SLOWER = "faster than predicted", "slower than predicted"


def _quantile(sorted_values: list[float], q: float) -> float:
    position = q * (len(sorted_values) - 1)
    low = math.floor(position)
    high = min(low + 1, len(sorted_values) - 1)
    return sorted_values[low] + (sorted_values[high] - sorted_values[low]) * (position - low)


class PredictionCheck:
    """Measured against predicted batch times, window by window.

    >>> check = PredictionCheck({8: 40.0}, window=2, sustained=2)
    >>> for ms in (20, 21, 20, 22): verdict = check.observe(8, ms)
    >>> verdict, check.summary()["median_ratio"]
    ('faster than predicted', 0.525)
    """

    def __init__(self, predicted_ms: dict[int, float], *, window: int = WINDOW, bound: float = DISAGREE_BOUND,
                 noise_factor: float = NOISE_FACTOR, sustained: int = SUSTAINED):
        if window < 2 or sustained < 1 or bound <= 0:
            raise ValueError(f"window >= 2, sustained >= 1 and bound > 0, got {window}, {sustained}, {bound}")
        self.predicted_ms = {int(k): float(v) for k, v in predicted_ms.items() if v > 0}
        self.window, self.bound, self.noise_factor, self.sustained = window, bound, noise_factor, sustained
        self.verdict: str | None = None
        self.windows = 0
        self.disagreeing = 0          # windows that disagreed, in all
        self._run: tuple[str | None, int] = (None, 0)  # the current streak's direction and length
        self._ratios: list[float] = []
        self._last: dict | None = None  # the last window's numbers
        self._verdict_window: dict | None = None

    def observe(self, size: int, ms: float) -> str | None:
        """One full batch of `size` images took `ms`. Returns the verdict (FASTER or SLOWER) on the batch that
        makes it, None otherwise (also for sizes without a prediction)."""
        predicted = self.predicted_ms.get(size)
        if predicted is None or ms <= 0 or self.verdict is not None:
            return None
        self._ratios.append(ms / predicted)
        if len(self._ratios) < self.window:
            return None
        ratios, self._ratios = sorted(self._ratios), []
        return self._judge(ratios)

    def _judge(self, ratios: list[float]) -> str | None:
        median = _quantile(ratios, 0.5)
        spread = (_quantile(ratios, 0.75) - _quantile(ratios, 0.25)) / median
        allowed = max(self.bound, self.noise_factor * spread)
        self.windows += 1
        self._last = {"median_ratio": round(median, 3), "spread": round(spread, 3), "allowed": round(allowed, 3)}
        direction = None
        if abs(math.log(median)) > math.log1p(allowed):
            direction = FASTER if median < 1 else SLOWER
            self.disagreeing += 1
        streak = self._run[1] + 1 if direction is not None and direction == self._run[0] else int(direction is not None)
        self._run = (direction, streak)
        if direction is not None and streak >= self.sustained:
            self.verdict = direction
            self._verdict_window = self._last
        return self.verdict

    def summary(self) -> dict:
        """For the job summary: windows judged, how many disagreed, the last window's median ratio
        (measured / predicted) and spread, and the verdict with what it means."""
        last = self._verdict_window or self._last or {}
        summary = {"windows": self.windows, "window_batches": self.window, "disagreeing_windows": self.disagreeing,
                   "median_ratio": last.get("median_ratio"), "spread": last.get("spread"),
                   "bound": self.bound, "verdict": self.verdict or ("agrees" if self.windows else "too few batches")}
        if self.verdict is not None:
            ratio = last["median_ratio"]
            times = f"{1 / ratio:.2f}x faster" if self.verdict == FASTER else f"{ratio:.2f}x slower"
            summary["message"] = (f"batches ran {times} than the device profile predicted for {self.sustained} "
                                  f"windows of {self.window} batches (beyond the {100 * self.bound:.0f}% bound and "
                                  "the noise)")
        return summary
