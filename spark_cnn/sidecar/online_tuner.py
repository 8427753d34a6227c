"""Correct a sidecar's starting batch size online, from the batch times it measures (pure: plain numbers in).

The start comes from the analytical model (perf/startpoint.py) or the device's default; the service feeds the
tuner each full batch's device time and reads back the size to assemble next.
"""

from __future__ import annotations

# A neighbour must beat the current size by more than 3% to move there: smaller gains are within the noise of
# a shared machine and cost memory and latency (the same tolerance the offline pick uses, perf/tuner.py).
MOVE_TOLERANCE = 0.03

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
                 tolerance: float = MOVE_TOLERANCE, predicted: dict[int, float] | None = None):
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
