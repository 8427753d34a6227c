"""Whether a calibration can be trusted: it times a sample of its own benchmarks again at the end and compares.

A host busy with other work slows some benchmarks and not others, by amounts that change from one second to
the next; a quiet one gives the same minimum twice. So `SampledBench` keeps every k-th benchmark it times
(k doubles as the run goes, so at most SAMPLE_POINTS are kept), `time_again` repeats them after the last
section, and `judge` (pure) compares the two minima. `steady` (pure, given the run) repeats a calibration that
disagrees with itself, or that repeated but timed what curve_check.py finds implausible, once, then refuses
with one line, unless told to accept it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from spark_cnn.errors import ConfigError
from spark_cnn.perf.calibration.harness import Bench, Timing

__all__ = ["ALLOW_NOISY_ENV", "ATTEMPTS", "REPEAT_BOUND", "NoisyCalibration", "Repeatability", "SampledBench",
           "allow_noisy_default", "judge", "steady"]

# The median disagreement between a benchmark's two minima that a calibration may show. Minima are robust: on
# the shared 2-core development host at load average 12 the median stayed at 5-6% while single points moved up
# to 80% (docs/perf-model.md, "A calibration to trust"); twice that median means most benchmarks moved, i.e.
# the load changed during the run. A load that stays high slows both passes alike: host_load records it.
REPEAT_BOUND = 0.10
# Benchmarks kept for the repeat: enough for a median that one outlier does not move; few enough to take a
# second or two.
SAMPLE_POINTS = 16
# Fewer repeated points than this say nothing (a tiny budget): the calibration is accepted and says so.
MIN_POINTS = 4
# Only calls this short are kept: repeating them is cheap, and the tensors they keep alive are small.
SAMPLE_MAX_CALL_S = 0.005
# A calibration that disagrees with itself is run once more before it is refused: a passing burst of work
# on the host should not need the user.
ATTEMPTS = 2
# Set to 1 to accept a calibration that disagrees with itself (what --allow-noisy-calibration does).
ALLOW_NOISY_ENV = "SPARK_CNN_ALLOW_NOISY_CALIBRATION"


class NoisyCalibration(ConfigError):
    """A calibration whose repeated measurements disagreed beyond REPEAT_BOUND on every attempt."""


def allow_noisy_default() -> bool:
    return os.environ.get(ALLOW_NOISY_ENV, "").strip().lower() in ("1", "true", "yes")


@dataclass(frozen=True)
class Repeatability:
    """How far a sample of benchmarks moved when timed again: relative differences of their minima."""

    points: int
    median_pct: float
    max_pct: float
    bound_pct: float = 100 * REPEAT_BOUND
    # What the run's own measurements say is implausible although they repeated (curve_check.py): a state of
    # the host that lasts longer than a calibration.
    anomalies: tuple[str, ...] = ()

    @property
    def judged(self) -> bool:
        return self.points >= MIN_POINTS

    @property
    def ok(self) -> bool:
        return (not self.judged or self.median_pct <= self.bound_pct) and not self.anomalies

    def as_dict(self) -> dict:
        return {"points": self.points, "median_pct": self.median_pct, "max_pct": self.max_pct,
                "bound_pct": self.bound_pct, "anomalies": list(self.anomalies), "ok": self.ok}


def judge(first_s: Sequence[float], again_s: Sequence[float], bound: float = REPEAT_BOUND) -> Repeatability:
    """Compare two timings of the same benchmarks (seconds, best of each): the median and largest relative
    difference, each against the faster of the pair.

    >>> judge([1.0, 2.0, 3.0, 4.0], [1.02, 2.0, 3.3, 4.0]).as_dict()
    {'points': 4, 'median_pct': 1.0, 'max_pct': 10.0, 'bound_pct': 10.0, 'anomalies': [], 'ok': True}
    """
    if len(first_s) != len(again_s):
        raise ValueError(f"{len(first_s)} first timings but {len(again_s)} repeated ones")
    diffs = sorted(abs(a - b) / min(a, b) for a, b in zip(first_s, again_s, strict=True) if min(a, b) > 0)
    if not diffs:
        return Repeatability(0, 0.0, 0.0, round(100 * bound, 1))
    mid = len(diffs) // 2
    median = diffs[mid] if len(diffs) % 2 else (diffs[mid - 1] + diffs[mid]) / 2
    return Repeatability(len(diffs), round(100 * median, 1), round(100 * diffs[-1], 1), round(100 * bound, 1))


class SampledBench(Bench):
    """A Bench that keeps a thinning sample of what it timed, to time it again at the end (`time_again`)."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._stride = 1
        self._seen = 0
        self._sample: list[tuple[Callable, Callable | None, float]] = []

    def time(self, fn: Callable[..., Any], fresh: Callable[[], tuple] | None = None) -> Timing:
        timing = super().time(fn, fresh)
        self._seen += 1
        if self._seen % self._stride == 0 and timing.best_s <= SAMPLE_MAX_CALL_S:
            self._sample.append((fn, fresh, timing.best_s))
            if len(self._sample) > SAMPLE_POINTS:  # keep every other one, and from now on every 2k-th
                self._sample = self._sample[1::2]
                self._stride *= 2
        return timing

    def time_again(self) -> Repeatability:
        """Time the sample again (as before: warm-up, repeats, minimum) and judge the two minima."""
        sample, self._sample = self._sample, []
        again = [super(SampledBench, self).time(fn, fresh).best_s for fn, fresh, _ in sample]
        return judge([best for _, _, best in sample], again)


def steady(run: Callable[[], Any], *, what: str, allow_noisy: bool, attempts: int = ATTEMPTS) -> Any:
    """`run()` (a DeviceProfile whose `repeatability` is a Repeatability.as_dict() and `load` a host_load
    summary) until one attempt repeats within its bound and shows no anomaly; after `attempts`, the steadiest
    one (without an anomaly if one has none) if `allow_noisy`, else NoisyCalibration. The returned profile's
    repeatability says how many attempts it took."""
    tried = []
    for attempt in range(1, attempts + 1):
        profile = run()
        if profile.repeatability.get("ok", True):
            return replace(profile, repeatability={**profile.repeatability, "attempts": attempt, "forced": False})
        tried.append(profile)
    steadiest = min(tried, key=lambda p: (bool(p.repeatability.get("anomalies")), p.repeatability["median_pct"]))
    rep, load = steadiest.repeatability, steadiest.load or {}
    force = f"force it with --allow-noisy-calibration ({ALLOW_NOISY_ENV}=1)"
    if allow_noisy:
        why = "its timings looked implausible" if rep.get("anomalies") else "its repeated measurements disagreed"
        return replace(steadiest, repeatability={**rep, "attempts": attempts, "forced": True},
                       notes=(*steadiest.notes, f"accepted although {why} ({ALLOW_NOISY_ENV}=1 or "
                                                "--allow-noisy-calibration)"))
    if rep.get("anomalies") and rep["median_pct"] <= rep["bound_pct"]:
        raise NoisyCalibration(
            f"calibration of {what}: {rep['anomalies'][0]} in {attempts} attempts, although it repeated within "
            f"{rep['median_pct']}%: a state of the host that a GEMM before each call did not clear "
            f"(docs/perf-model.md, \"A calibration to trust\"); calibrate again later, or {force}")
    others = load.get("others_cpu_share")
    busy = f"other processes used {100 * others:.0f}% of its {load.get('cores')} cores" if others is not None \
        else f"load average {load.get('loadavg_end')}"
    raise NoisyCalibration(
        f"calibration of {what}: the host is too busy to measure ({busy}): repeated benchmarks differed by "
        f"{rep['median_pct']}% (median of {rep['points']}; bound {rep['bound_pct']}%) in {attempts} attempts; "
        f"stop other work and calibrate again, or {force}")
