"""Correct a sidecar's starting batch size online, from the batch times it measures (pure: plain numbers in).

The start comes from the analytical model (perf/startpoint.py) or the device's default; the service feeds the
tuner each full batch's device time and reads back the size to assemble next.
"""

from __future__ import annotations

import math
from statistics import median

# A neighbour must beat the current size by more than 3% to move there: smaller gains are within the noise of
# a shared machine and cost memory and latency (the same tolerance the offline pick uses, perf/tuner.py).
MOVE_TOLERANCE = 0.03
# Full batches per size per round: the median of 4 ignores one stalled batch, and a round stays short (a second
# or less on a CPU) so that a neighbour's load mostly weighs on both sizes of a round alike.
BLOCK_BATCHES = 4
# Rounds per trial: 4 at least so that their spread measures the noise; 16 at most so that a trial ends. On the
# simulated shared host of tests/unit/sidecar/test_online_tuner.py (400 runs) 96% of runs settled within 5% of
# the best after a median of 208 batches; (3, 8) rounds 88% after 144, (6, 16) 97% after 240.
MIN_ROUNDS, MAX_ROUNDS = 4, 16
# A trial ends early once its median gain is this many standard errors above or below the tolerance.
NOISE_MARGIN = 2.0
MAD_TO_SD = 1.4826         # a normal sample's standard deviation per median absolute deviation
MEDIAN_SE_FACTOR = 1.2533  # a median's standard error per mean's (sqrt(pi / 2))


class OnlineTuner:
    """Corrects the starting batch size from measured batch times, by trying neighbours (hill climbing).

    A model's error is partly a scale factor, which does not move the best batch size; what matters is the
    shape of the curve, and that is measured here. The tuner first runs `explore_after` full batches at the
    start (by default as many as the shortest trial takes: a job that has not run that long would likely end
    before a trial could decide, so it never explores), then tries double the size, moving there if it gives
    more images per second by more than `tolerance` and climbing on; when a step up does not win it tries half
    the size the same way; when neither wins it settles, never to move again, and it never tries a size twice.

    A trial alternates the two sizes in blocks of `block` batches, trial-home-trial-home..., so that a
    neighbour's load, or a drift, weighs on both alike. Each round (a block of each) gives the ratio of the two
    block medians; the trial ends once the median ratio is clear of the tolerance by `noise_margin` standard
    errors (from the rounds' spread), after `rounds[0]` rounds at the least, and at `rounds[1]` it goes by the
    median alone. Only full batches count: partial ones mean the clients, not the device, set the pace.

    >>> t = OnlineTuner(start=8, block=1, rounds=(2, 2), max_size=32, explore_after=2)
    >>> for ms in (40, 40): t.observe(8, ms)
    >>> t.target  # trying 16 (200 img/s at 8)
    16
    >>> for size, ms in ((16, 100), (8, 40), (16, 100), (8, 40)): t.observe(size, ms)
    >>> t.target  # 160 img/s at 16 lost twice: try 4 instead
    4
    >>> for size, ms in ((4, 30), (8, 40), (4, 30), (8, 40)): t.observe(size, ms)
    >>> t.target, t.settled  # 133 img/s at 4: 8 stays
    (8, True)
    """

    def __init__(self, start: int, *, block: int = BLOCK_BATCHES, rounds: tuple[int, int] = (MIN_ROUNDS, MAX_ROUNDS),
                 explore_after: int | None = None, max_size: int = 512, min_size: int = 1,
                 tolerance: float = MOVE_TOLERANCE, noise_margin: float = NOISE_MARGIN,
                 predicted: dict[int, float] | None = None):
        if not min_size <= start <= max_size:
            raise ValueError(f"start {start} outside [{min_size}, {max_size}]")
        if block < 1 or not 1 <= rounds[0] <= rounds[1]:
            raise ValueError(f"block {block} and rounds {rounds}: need block >= 1 and 1 <= min <= max rounds")
        self.target = start
        self.block = block
        self.rounds = rounds
        self.explore_after = 2 * rounds[0] * block if explore_after is None else explore_after
        self.max_size = max_size
        self.min_size = min_size
        self.tolerance = tolerance
        self.noise_margin = noise_margin
        self.observed: dict[int, list[float]] = {}   # batch size -> measured ms of full batches
        self.predicted = predicted or {}              # batch size -> images/s the analytical model expected
        self.start = start
        self.settled = False
        self.batches = 0       # full batches observed
        self._home = start     # the best size so far
        self._going = "up"     # doubling first; halving once doubling stops winning
        self._trial: int | None = None
        self._gains: list[float] = []       # per round of the trial: log(trial images/s / home images/s)
        self._first: float | None = None    # images/s of the round's first block, once it has run
        self._times: list[float] = []       # ms of the block under way
        self._deviations: list[float] = []  # |log(ms / its block's median)| of the trial's batches

    @property
    def best(self) -> int:
        """The best size measured so far (the target, but for a trial under way)."""
        return self._home

    def rate(self, size: int) -> float | None:
        """Measured images/s at `size` (median batch time), or None before a block's worth of batches."""
        times = self.observed.get(size, [])
        if len(times) < self.block:
            return None
        return 1000.0 * size / median(times)

    def observe(self, size: int, ms: float) -> None:
        """One full batch of `size` rows took `ms` on the device."""
        if self.settled or size != self.target or ms <= 0:
            return
        self.observed.setdefault(size, []).append(ms)
        self.batches += 1
        if self._trial is None:
            if self.batches >= self.explore_after:
                self._try_next()
            return
        self._times.append(ms)
        if len(self._times) < self.block:
            return
        middle = median(self._times)
        self._deviations += [abs(math.log(t / middle)) for t in self._times]
        self._times = []
        rate = 1000.0 * size / middle
        if self._first is None:
            self._first = rate
        else:
            self._gains.append(math.log(self._first / rate))  # the trial's block, then the home's
            self._first = None
            if self._decided():
                return
        self.target = self._block_size()

    def _block_size(self) -> int:
        """Blocks go trial, home, trial, home, ...: a neighbour's load spans both sizes about equally."""
        return self._home if self._first is not None else self._trial

    def _decided(self) -> bool:
        """After a round: whether the trial has ended (moved, or kept the size)."""
        gains = self._gains
        if len(gains) < self.rounds[0]:
            return False
        gain = median(gains)
        # The rounds' spread, but never below what the batches' own spread implies for a ratio of two block
        # medians: a few rounds can agree by chance.
        spread = max(MAD_TO_SD * median(abs(g - gain) for g in gains),
                     math.sqrt(2 / self.block) * MEDIAN_SE_FACTOR * MAD_TO_SD * median(self._deviations))
        margin = self.noise_margin * MEDIAN_SE_FACTOR * spread / math.sqrt(len(gains))
        threshold = math.log1p(self.tolerance)
        if abs(gain - threshold) <= margin and len(gains) < self.rounds[1]:
            return False              # within the noise: another round
        if gain > threshold:
            self._home = self._trial  # better by more than the tolerance: move there, keep going that way
        elif self._going == "up":
            self._going = "down"      # a step up did not win: try the other way
        else:
            self._settle()
            return True
        self._try_next()
        return True

    def _try_next(self) -> None:
        self._gains, self._first, self._times, self._deviations = [], None, [], []
        while True:
            following = self._home * 2 if self._going == "up" else self._home // 2
            if self.min_size <= following <= self.max_size and following not in self.observed:
                self._trial = self.target = following
                return
            if self._going == "down":
                return self._settle()
            self._going = "down"

    def _settle(self) -> None:
        self.target = self._home
        self._trial = None
        self.settled = True

    def summary(self) -> dict:
        summary = {"start": self.start, "target": self.target, "best": self.best, "settled": self.settled,
                   "batches": self.batches,
                   "observed_images_per_s": {str(s): round(r, 1) for s in sorted(self.observed)
                                             if (r := self.rate(s)) is not None}}
        if self.predicted:
            summary["predicted_images_per_s"] = {str(s): r for s, r in sorted(self.predicted.items())}
        return summary
