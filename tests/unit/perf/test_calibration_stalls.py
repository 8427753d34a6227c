"""Calibration points with a stalled call: more calls, so the median is a typical one (harness.Bench.time), and
curve points whose cost per byte jumps beyond what sizes do are timed again (curve_bench.time_curves)."""

from __future__ import annotations

import pytest
import torch

from spark_cnn.perf_tools.calibration import curve_bench, harness
from spark_cnn.perf_tools.calibration.harness import Bench, Budget, Timing


class ScriptedClock:
    """A clock that only the timed function moves: each call of `call` takes the next scripted duration."""

    def __init__(self, durations):
        self.now = 0.0
        self.durations = list(durations)
        self.calls = 0

    def __call__(self) -> float:
        return self.now

    def call(self, *args) -> None:
        self.now += self.durations[self.calls]
        self.calls += 1


def scripted_bench(durations) -> tuple[Bench, ScriptedClock]:
    clock = ScriptedClock(durations)
    bench = Bench(torch.device("cpu"), Budget(60.0, clock=clock))
    bench.pollute = None  # nothing to write before each call: the clock is the only thing under test
    return bench, clock


def test_a_first_call_that_stalls_gets_more_calls_and_is_not_the_typical_one():
    # warm-up 40 ms, then a stalled 570 ms call (long: one more call only), then calls of 40 ms
    bench, clock = scripted_bench([0.04, 0.57, 0.04, 0.04, 0.04])
    timing = bench.time(clock.call)
    assert timing.seconds == pytest.approx((0.57, 0.04, 0.04, 0.04))
    assert bench.us_without_faults(timing) == pytest.approx(40_000)  # was the upper of (570, 40): 570 ms


def test_calls_that_agree_get_no_extra_calls():
    bench, clock = scripted_bench([0.06] * 10)
    timing = bench.time(clock.call)
    assert len(timing.seconds) == 2 and clock.calls == 3  # warm-up, the long first call, one more


@pytest.mark.parametrize("calls", [(0.010, 0.0199, 0.011), (0.010, 0.021, 0.011)])
def test_extra_calls_come_only_beyond_the_stall_ratio(calls):
    bench, clock = scripted_bench([0.01, *calls, 0.01, 0.01])
    timing = bench.time(clock.call)
    beyond = max(calls) > harness.STALL_RATIO * min(calls)
    assert len(timing.seconds) == 3 + (harness.STALL_EXTRA_CALLS if beyond else 0)


class CurveBench(Bench):
    """Times every curve point at a scripted cost per byte, with a stall at one (kind, side) the first
    `stalls` times it is timed (once: one stalled call of two; more: every call); remembers what it timed."""

    def __init__(self, stalled: tuple[str, int], stalls: int):
        super().__init__(torch.device("cpu"), Budget(600.0))
        self.pollute = None
        self.stalled, self.stalls = stalled, stalls
        self.timed: list[tuple[str, int]] = []
        self.current: tuple[str, int] | None = None

    def time(self, fn, fresh=None) -> Timing:
        if self.current is None:  # call_us's own timings after the curves
            return Timing((1e-6,) * 3, (0,) * 3)
        kind, side = self.current
        self.current = None
        self.timed.append((kind, side))
        s = 64 * side * side * 4 / 10_000 * 1e-6  # 10 GB/s
        if (kind, side) == self.stalled and self.timed.count((kind, side)) <= self.stalls:
            if self.stalls == 1:  # as Bench.time left it before: a long stalled call, then one more
                return Timing((20 * s, s), (0, 0))
            return Timing((20 * s,) * 3, (0,) * 3)
        return Timing((s,) * 3, (0,) * 3)


@pytest.fixture
def one_kind(monkeypatch):
    """curve_cases with relu alone, its maker telling the bench which point it is about to time."""
    real = curve_bench.curve_cases

    def cases(bench):
        make = real(bench)["relu"]

        def tell(side):
            bench.current = ("relu", side)
            return make(side)
        return {"relu": tell}
    monkeypatch.setattr(curve_bench, "curve_cases", cases)
    monkeypatch.setattr(curve_bench, "CURVE_SIDES", SIDES)


# 0.1 to 12.8 MB: eight sizes, as time_curves interleaves them
SIDES = (20, 28, 40, 56, 80, 112, 160, 224)


@pytest.mark.usefixtures("one_kind")
def test_a_curve_point_that_jumps_is_timed_again_and_priced_at_the_median_of_all_its_calls():
    bench = CurveBench(stalled=("relu", 224), stalls=1)
    curves, _ = curve_bench.time_curves(bench)
    assert bench.timed.count(("relu", 224)) == 2
    assert all(bench.timed.count(("relu", side)) == 1 for side in SIDES[:-1])
    us = dict(curves["relu"])
    # five calls: one stalled at 20 x 1284.5 us, four at 1284.5 (the upper median of the first two was the stall)
    assert us[64 * 224 * 224 * 4] == pytest.approx(64 * 224 * 224 * 4 / 10_000)


@pytest.mark.usefixtures("one_kind")
def test_a_point_that_keeps_jumping_is_timed_again_at_most_jump_retries_times_and_kept():
    bench = CurveBench(stalled=("relu", 224), stalls=99)
    curves, _ = curve_bench.time_curves(bench)
    assert bench.timed.count(("relu", 224)) == 1 + curve_bench.JUMP_RETRIES
    assert dict(curves["relu"])[64 * 224 * 224 * 4] == pytest.approx(20 * 64 * 224 * 224 * 4 / 10_000)


@pytest.mark.usefixtures("one_kind")
def test_a_jump_from_below_the_smallest_judged_size_is_not_timed_again():
    # 40 px (0.4 MB) against 28 px (0.2 MB): sizes where the cache, not a stall, changes the cost per byte
    bench = CurveBench(stalled=("relu", 40), stalls=1)
    curve_bench.time_curves(bench)
    assert bench.timed.count(("relu", 40)) == 1
