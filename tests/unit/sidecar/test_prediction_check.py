"""The check of measured against predicted batch times (pure, fed numbers), and what the sidecar does with its
verdict: a cached profile that predicted too slow is marked stale, anything else is only reported."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from spark_cnn.perf.device_key import cache_path, device_key
from spark_cnn.perf.profile import stale_reason
from spark_cnn.perf.startpoint import CACHE_DIR_ENV, cached_profile
from spark_cnn.sidecar.prediction_check import DISAGREE_BOUND, FASTER, SLOWER, SUSTAINED, WINDOW, PredictionCheck
from spark_cnn.sidecar.startup import act_on_verdict
from tests.perf_doubles import synthetic_profile

PREDICTED = {8: 40.0, 16: 70.0}


def feed(check: PredictionCheck, size: int, ratios) -> list[str | None]:
    return [check.observe(size, PREDICTED[size] * r) for r in ratios]


def jitter(ratio: float, n: int, spread: float = 0.02, seed: int = 1) -> list[float]:
    return list(ratio * (1 + np.random.default_rng(seed).uniform(-spread, spread, n)))


def test_batches_near_the_prediction_agree():
    check = PredictionCheck(PREDICTED)
    assert not any(feed(check, 8, jitter(1.25, 10 * WINDOW)))  # within the bound: the model's own error
    summary = check.summary()
    assert summary["verdict"] == "agrees" and summary["windows"] == 10 and summary["disagreeing_windows"] == 0


def test_a_sustained_run_of_faster_batches_gives_one_verdict_on_the_batch_that_makes_it():
    check = PredictionCheck(PREDICTED)
    verdicts = feed(check, 8, jitter(0.6, SUSTAINED * WINDOW))
    assert verdicts[-1] == FASTER and not any(verdicts[:-1])
    assert not any(feed(check, 8, jitter(0.6, WINDOW)))  # said once
    summary = check.summary()
    assert summary["verdict"] == FASTER and summary["median_ratio"] == pytest.approx(0.6, abs=0.02)
    assert "1.6" in summary["message"] and "faster" in summary["message"]


def test_slower_batches_give_the_other_verdict():
    check = PredictionCheck(PREDICTED)
    assert feed(check, 16, jitter(1.0 + 2 * DISAGREE_BOUND, SUSTAINED * WINDOW))[-1] == SLOWER


def test_one_bad_moment_is_not_a_verdict():
    check = PredictionCheck(PREDICTED)
    ratios = jitter(1.0, WINDOW) + jitter(0.5, (SUSTAINED - 1) * WINDOW) + jitter(1.0, WINDOW) + \
        jitter(0.5, (SUSTAINED - 1) * WINDOW)
    assert not any(feed(check, 8, ratios))
    assert check.summary()["disagreeing_windows"] == 2 * (SUSTAINED - 1) and check.verdict is None


def test_a_jittery_job_does_not_count_as_a_disagreement():
    check = PredictionCheck(PREDICTED)
    # median 40% off, but the batches themselves spread over a factor of four: noise, not a verdict
    assert not any(feed(check, 8, jitter(0.6, 5 * WINDOW, spread=0.6)))
    assert check.summary()["spread"] > DISAGREE_BOUND / 3


def test_sizes_without_a_prediction_and_short_jobs_say_nothing():
    check = PredictionCheck(PREDICTED)
    assert check.observe(4, 1.0) is None and check.observe(8, 0.0) is None
    assert check.summary()["verdict"] == "too few batches"


# --- what the sidecar does with a verdict ---------------------------------------------------------------------------

@pytest.fixture
def cached(tmp_path, monkeypatch):
    """A cached profile of this CPU with one thread, in a cache of the test's own."""
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path))
    path = cache_path("cpu", 1, str(tmp_path))
    with open(path, "w") as f:
        f.write(dataclasses.replace(synthetic_profile(), key=device_key("cpu", 1)).to_json())
    return path


def _verdict(source, verdict):
    return act_on_verdict("cpu", 1, source, verdict)


def test_a_cached_profile_that_predicted_too_slow_is_marked_stale(cached):
    assert cached_profile("cpu", 1) is not None
    action = _verdict("cached", FASTER)
    assert "marked the cached device profile stale" in action
    assert "faster" in stale_reason(cached) and cached_profile("cpu", 1) is None


@pytest.mark.parametrize("source, verdict", [("cached", SLOWER), ("job", FASTER)])
def test_slower_batches_or_a_jobs_own_profile_are_only_reported(cached, source, verdict):
    assert _verdict(source, verdict).startswith("reported only")
    assert stale_reason(cached) is None and cached_profile("cpu", 1) is not None
