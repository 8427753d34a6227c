"""Whether a calibration can be trusted, and how far: it times a sample of its own benchmarks again at the end.

A host busy with other work slows some benchmarks and not others, by amounts that change from one second to
the next; a quiet one gives the same minimum twice. So `SampledBench` keeps every k-th benchmark it times
(k doubles as the run goes, so at most SAMPLE_POINTS are kept) and `time_again` repeats them after the last
section: once, and when the tables and that repeat disagree, up to REPEAT_PASSES times, so that the tables are
judged against the median of their repeats (`repeat_passes`, pure) rather than against one pass a burst of
other work may have hit. `judge_passes` (pure) gives the median disagreement, which is also the calibration's
spread: the interval its predictions carry. `steady` (pure, given the run) repeats a calibration that disagrees
with itself, or that repeated but timed what curve_check.py finds implausible, once; then it keeps the steadier
attempt marked noisy (its spread recorded, `noisy_warning` says what that means), or refuses it with one line
when `strict`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from statistics import median
from typing import Any

from spark_cnn.errors import ConfigError
from spark_cnn.perf_tools.calibration.harness import Bench, Timing

__all__ = ["ATTEMPTS", "REPEAT_BOUND", "REPEAT_PASSES", "NoisyCalibration", "Repeatability", "SampledBench",
           "judge", "judge_passes", "noisy_warning", "repeat_passes", "steady"]

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
# Timings of the sample when the first repeat disagrees with the tables: the median of five ignores two passes
# that a burst of other work hit, and a pass costs at most 16 benchmarks x 11 calls of under 5 ms (about 1 s).
REPEAT_PASSES = 5
# A calibration that disagrees with itself is run once more before it is kept as noisy (or refused, when
# strict): a passing burst of work on the host should not need the user.
ATTEMPTS = 2


class NoisyCalibration(ConfigError):
    """A strict calibration whose repeated measurements disagreed beyond REPEAT_BOUND on every attempt."""


@dataclass(frozen=True)
class Repeatability:
    """How far the tables' minima sit from the same benchmarks timed again: relative differences, median and
    largest, against the median of `passes` repeats."""

    points: int
    median_pct: float
    max_pct: float
    bound_pct: float = 100 * REPEAT_BOUND
    # What the run's own measurements say is implausible although they repeated (curve_check.py): a state of
    # the host that lasts longer than a calibration.
    anomalies: tuple[str, ...] = ()
    passes: int = 1

    @property
    def judged(self) -> bool:
        return self.points >= MIN_POINTS

    @property
    def ok(self) -> bool:
        return (not self.judged or self.median_pct <= self.bound_pct) and not self.anomalies

    def as_dict(self) -> dict:
        return {"points": self.points, "median_pct": self.median_pct, "max_pct": self.max_pct,
                "bound_pct": self.bound_pct, "anomalies": list(self.anomalies), "ok": self.ok,
                "passes": self.passes}


def judge(first_s: Sequence[float], again_s: Sequence[float], bound: float = REPEAT_BOUND) -> Repeatability:
    """Compare two timings of the same benchmarks (seconds, best of each): the median and largest relative
    difference, each against the faster of the pair.

    >>> judge([1.0, 2.0, 3.0, 4.0], [1.02, 2.0, 3.3, 4.0]).as_dict()
    {'points': 4, 'median_pct': 1.0, 'max_pct': 10.0, 'bound_pct': 10.0, 'anomalies': [], 'ok': True, 'passes': 1}
    """
    return judge_passes(first_s, [again_s], bound)


def judge_passes(first_s: Sequence[float], passes: Sequence[Sequence[float]],
                 bound: float = REPEAT_BOUND) -> Repeatability:
    """Compare the tables' timings (`first_s`) with `passes` repeats of the same benchmarks: per benchmark the
    relative difference between its first timing and the median of its repeats, against the faster of the two.

    >>> judge_passes([1.0] * 4, [[1.5] * 4, [1.0] * 4, [1.02] * 4]).median_pct   # one disturbed pass of three
    2.0
    """
    if any(len(again) != len(first_s) for again in passes):
        raise ValueError(f"{len(first_s)} first timings but repeats of {sorted({len(a) for a in passes})}")
    reference = [median(times) for times in zip(*passes, strict=True)] if passes else []
    diffs = sorted(abs(a - b) / min(a, b) for a, b in zip(first_s, reference, strict=True) if min(a, b) > 0)
    if not diffs:
        return Repeatability(0, 0.0, 0.0, round(100 * bound, 1), passes=len(passes))
    return Repeatability(len(diffs), round(100 * median(diffs), 1), round(100 * diffs[-1], 1), round(100 * bound, 1),
                         passes=len(passes))


def repeat_passes(first_s: Sequence[float], time_pass: Callable[[], Sequence[float]], *,
                  max_passes: int = REPEAT_PASSES, bound: float = REPEAT_BOUND) -> Repeatability:
    """Time the sample again (`time_pass()`: seconds per benchmark, as `first_s`) once, and while the tables
    disagree with the median of the repeats, again, up to `max_passes` in all.

    >>> passes = iter([[1.4] * 4, [1.0] * 4, [1.01] * 4])   # the first repeat hit a burst of other work
    >>> rep = repeat_passes([1.0] * 4, lambda: next(passes))
    >>> rep.passes, rep.ok
    (3, True)
    """
    done = [list(time_pass())]
    rep = judge_passes(first_s, done, bound)
    while rep.judged and not rep.ok and len(done) < max_passes:
        done.append(list(time_pass()))
        rep = judge_passes(first_s, done, bound)
    return rep


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
        """Time the sample again (as before: warm-up, repeats, minimum), more than once when the first repeat
        disagrees (repeat_passes), and judge the tables' minima against the repeats'."""
        sample, self._sample = self._sample, []

        def one_pass() -> list[float]:
            return [super(SampledBench, self).time(fn, fresh).best_s for fn, fresh, _ in sample]
        return repeat_passes([best for _, _, best in sample], one_pass)


def steady(run: Callable[[], Any], *, what: str, strict: bool = False, attempts: int = ATTEMPTS) -> Any:
    """`run()` (a DeviceProfile whose `repeatability` is a Repeatability.as_dict() and `load` a host_load
    summary) until one attempt repeats within its bound and shows no anomaly; after `attempts`, the steadiest
    one (without an anomaly if one has none), marked noisy, or NoisyCalibration when `strict`. The returned
    profile's repeatability says how many attempts it took and whether it was kept noisy; its `spread` is its
    median disagreement."""
    tried = []
    for attempt in range(1, attempts + 1):
        profile = run()
        if profile.repeatability.get("ok", True):
            return _kept(profile, attempt, noisy=False)
        tried.append(profile)
    steadiest = min(tried, key=lambda p: (bool(p.repeatability.get("anomalies")), p.repeatability["median_pct"]))
    rep = steadiest.repeatability
    if not strict:
        why = rep["anomalies"][0] if rep.get("anomalies") else \
            f"its repeated benchmarks differed by {rep['median_pct']}% (bound {rep['bound_pct']}%)"
        return replace(_kept(steadiest, attempts, noisy=True),
                       notes=(*steadiest.notes, f"kept although {why}: predictions carry +-{rep['median_pct']}%"))
    keep = "or calibrate without --strict to keep it with its measured spread"
    if rep.get("anomalies") and rep["median_pct"] <= rep["bound_pct"]:
        raise NoisyCalibration(
            f"calibration of {what}: {rep['anomalies'][0]} in {attempts} attempts, although it repeated within "
            f"{rep['median_pct']}%: a state of the host that a GEMM before each call did not clear "
            f"(docs/perf-model.md, \"A calibration to trust\"); calibrate again later, {keep}")
    raise NoisyCalibration(
        f"calibration of {what}: the host is too busy to measure ({_busy(steadiest.load)}): repeated benchmarks "
        f"differed by {rep['median_pct']}% (median of {rep['points']}; bound {rep['bound_pct']}%) in {attempts} "
        f"attempts; stop other work and calibrate again, {keep}")


def noisy_warning(profile: Any, what: str) -> str:
    """The one line a calibration kept noisy (steady without `strict`) is reported with: how noisy, what it
    means for predictions, and how to refuse such a calibration instead."""
    rep, strict = profile.repeatability, "pass --strict to refuse such a calibration"
    if rep.get("anomalies") and rep["median_pct"] <= rep["bound_pct"]:
        return (f"spark-cnn: warning: calibration of {what} kept although {rep['anomalies'][0]} in "
                f"{rep.get('attempts')} attempts: predictions for networks using them may run slow; calibrate "
                f"again later, or {strict}")
    return (f"spark-cnn: warning: calibration of {what} kept on a noisy host ({_busy(profile.load)}): repeated "
            f"benchmarks differed by {rep['median_pct']}% (median of {rep['points']}, {rep.get('passes', 1)} "
            f"repeat(s); bound {rep['bound_pct']}%) in {rep.get('attempts')} attempts, so its predictions carry "
            f"+-{rep['median_pct']}%; calibrate on a quiet host for tighter ones, or {strict}")


def _kept(profile: Any, attempts: int, *, noisy: bool) -> Any:
    rep = profile.repeatability
    return replace(profile, repeatability={**rep, "attempts": attempts, "noisy": noisy},
                   spread=round(rep.get("median_pct", 0.0) / 100, 4))


def _busy(load: dict | None) -> str:
    load = load or {}
    others = load.get("others_cpu_share")
    if others is not None:
        return f"other processes used {100 * others:.0f}% of its {load.get('cores')} cores"
    return f"load average {load.get('loadavg_end')}"
