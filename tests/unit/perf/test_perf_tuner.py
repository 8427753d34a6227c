"""The tuner's choices from a curve (the online correction: tests/unit/sidecar/test_online_tuner.py)."""

from __future__ import annotations

import pytest

from spark_cnn.errors import ConfigError
from spark_cnn.perf.tuner import Choice, CurvePoint, choose_batch_size


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

