"""The sidecar's start-up decisions, fed plain values: the batch size a service starts from and what corrects and
checks it, the queue bound, and what a sustained disagreement with the prediction leads to."""

from __future__ import annotations

import types

import pytest

from spark_cnn.sidecar.prediction_check import FASTER, SLOWER
from spark_cnn.sidecar.service import MAX_QUEUED_BATCHES
from spark_cnn.sidecar.startup import (
    AUTO_BATCH_ROWS,
    MAX_AUTO_BATCH_ROWS,
    REPORT_JOB_PROFILE,
    REPORT_SLOWER,
    SIZED_QUEUED_BATCHES,
    batch_start,
    default_batch_rows,
    max_batch_rows,
    predicted_batch_ms,
    queued_batches,
    service_rows,
    time_model_applies,
    verdict_response,
)
from spark_cnn.task.run_options import RunOptions


def test_without_a_prediction_a_service_starts_at_its_devices_default_and_only_the_tuner_corrects_it():
    start = batch_start("cuda")
    assert start.rows == AUTO_BATCH_ROWS["cuda"] and start.source is None
    assert start.tuner.target == start.rows and start.tuner.max_size == MAX_AUTO_BATCH_ROWS["cuda"]
    assert start.check is None  # nothing to compare measured batches with


def test_a_prediction_sets_the_start_the_tuners_curve_and_the_check():
    start = batch_start("cpu", (16, {8: 200.0, 16: 250.0, 32: 0.0}, "cached"))
    assert (start.rows, start.source) == (16, "cached")
    assert start.tuner.target == 16 and start.tuner.predicted == {8: 200.0, 16: 250.0, 32: 0.0}
    assert start.check is not None


def test_a_predicted_start_above_the_device_maximum_raises_the_tuners_bound():
    start = batch_start("cpu", (128, {128: 900.0}, "job"))
    assert start.rows == 128 and start.tuner.max_size == 128


def test_predicted_batch_times_leave_out_sizes_without_a_rate():
    assert predicted_batch_ms({8: 200.0, 16: 0.0, 4: 400.0}) == {8: 40.0, 4: 10.0}


def test_unknown_device_types_fall_back_to_the_cpus_start():
    assert default_batch_rows("mps") == AUTO_BATCH_ROWS["cpu"] and max_batch_rows("mps") == AUTO_BATCH_ROWS["cpu"]
    assert max_batch_rows("cpu") == MAX_AUTO_BATCH_ROWS["cpu"]


def test_a_jobs_batch_size_keys_its_service_else_the_device_default():
    assert service_rows(RunOptions(batch_size=3), "cuda") == 3
    assert service_rows(RunOptions(), "cuda") == AUTO_BATCH_ROWS["cuda"]


def test_images_at_their_own_sizes_queue_fewer_batches():
    assert queued_batches(sized=True) == SIZED_QUEUED_BATCHES < queued_batches(sized=False) == MAX_QUEUED_BATCHES


@pytest.mark.parametrize("sized, compile_, applies", [(False, False, True), (True, False, False),
                                                      (False, True, False)])
def test_the_time_model_predicts_uncompiled_fixed_size_models_only(sized, compile_, applies):
    endpoint = types.SimpleNamespace(sized=sized)  # a detector's or segmenter's images travel at their own sizes
    assert time_model_applies(endpoint, RunOptions(compile=compile_)) is applies


@pytest.mark.parametrize("source, verdict, report", [("cached", SLOWER, REPORT_SLOWER), ("job", SLOWER, REPORT_SLOWER),
                                                     ("job", FASTER, REPORT_JOB_PROFILE),
                                                     (None, FASTER, REPORT_JOB_PROFILE), ("cached", FASTER, None)])
def test_only_a_cached_profile_that_predicted_too_slow_is_to_be_marked_stale(source, verdict, report):
    assert verdict_response(source, verdict) == report
