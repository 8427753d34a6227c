"""The tuner's choices from a curve, and its online correction from measured batch times."""

from __future__ import annotations

import pytest

from spark_cnn.errors import ConfigError
from spark_cnn.perf.tuner import Choice, CurvePoint, choose_batch_size
from spark_cnn.sidecar.online_tuner import OnlineTuner


def _curve(ms_by_size: dict[int, float], mib_per_image: int = 0) -> list[CurvePoint]:
    return [CurvePoint(b, ms, b * mib_per_image * 2**20) for b, ms in ms_by_size.items()]


# images/s: 1 -> 100, 2 -> 160, 4 -> 200, 8 -> 205, 16 -> 210, 32 -> 180
CURVE = _curve({1: 10.0, 2: 12.5, 4: 20.0, 8: 39.0, 16: 76.2, 32: 177.8})


def test_performance_mode_takes_the_smallest_batch_within_3_percent_of_the_best():
    choice = choose_batch_size(CURVE)
    assert isinstance(choice, Choice)
    assert choice.best_images_per_s == pytest.approx(16 / 0.0762)
    assert choice.batch_size == 8  # 205.1 >= 0.97 * 210.0; 4 (200.0) is not
    assert "3%" in choice.reason


def test_memory_mode_takes_the_smallest_batch_reaching_90_percent():
    assert choose_batch_size(CURVE, mode="memory").batch_size == 4  # 200 >= 189; 2 (160) is not


def test_the_memory_budget_and_latency_bound_exclude_sizes():
    curve = _curve({1: 10.0, 2: 12.5, 4: 20.0, 8: 39.0, 16: 76.2, 32: 177.8}, mib_per_image=100)
    assert choose_batch_size(curve, memory_budget_bytes=500 * 2**20).batch_size == 4  # 8 needs 800 MiB
    assert choose_batch_size(CURVE, max_latency_ms=15).batch_size == 2


def test_nothing_feasible_and_bad_mode_are_config_errors():
    with pytest.raises(ConfigError, match="no batch size fits"):
        choose_batch_size(CURVE, max_latency_ms=1)
    with pytest.raises(ConfigError, match="--tuning fastest"):
        choose_batch_size(CURVE, mode="fastest")
    with pytest.raises(ConfigError):
        choose_batch_size([])


def _run(tuner: OnlineTuner, true_ms, max_batches: int = 1000) -> int:
    """Feed the tuner full batches at whatever size it asks for, timed by `true_ms(size)`."""
    for _ in range(max_batches):
        if tuner.settled:
            break
        tuner.observe(tuner.target, true_ms(tuner.target))
    return tuner.target


@pytest.mark.parametrize("start", [1, 4, 8, 32, 64])
def test_online_tuner_finds_the_best_size_of_a_curve_with_one_peak(start):
    rates = {1: 60, 2: 100, 4: 150, 8: 190, 16: 220, 32: 200, 64: 150, 128: 90}  # images/s, best at 16
    tuner = OnlineTuner(start, window=3, max_size=128)
    assert _run(tuner, lambda b: 1000 * b / rates[b]) == 16
    assert tuner.settled
    assert tuner.summary()["observed_images_per_s"]["16"] == pytest.approx(220)


def test_online_tuner_ignores_gains_within_the_tolerance_and_other_sizes():
    rates = {4: 100, 8: 102, 16: 101}  # flat: doubling never wins by 3%
    tuner = OnlineTuner(8, window=2, max_size=16)
    tuner.observe(3, 1.0)  # a partial batch of 3 rows is not evidence
    assert tuner.observed == {}
    assert _run(tuner, lambda b: 1000 * b / rates[b]) == 8


def test_online_tuner_stays_within_bounds():
    tuner = OnlineTuner(64, window=2, max_size=64, min_size=32)
    assert _run(tuner, lambda b: 1000 * b / {32: 100, 64: 120}[b]) == 64
    with pytest.raises(ValueError):
        OnlineTuner(128, max_size=64)


def test_online_tuner_uses_the_median_so_one_slow_batch_does_not_decide():
    tuner = OnlineTuner(8, window=5, max_size=16)
    for ms in (40, 40, 400, 40, 40):  # one stall (another process took the core)
        tuner.observe(8, ms)
    assert tuner.rate(8) == pytest.approx(200)
