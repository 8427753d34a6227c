"""Calibration and validation as they really run: one CPU calibration (one thread, a budget of a second) in this
process, its benchmarks and the isolated validation in child processes with the sidecar's allocator settings.
Processes, so not unit tests; the time model's arithmetic on synthetic profiles stays in tests/unit/perf."""

from __future__ import annotations

import dataclasses
import json
import shutil

import pytest
import torch

from spark_cnn.errors import ConfigError, ModelError
from spark_cnn.models.digits import DIGITS_FACTORY, DigitsCNN
from spark_cnn.perf.layers import analyse
from spark_cnn.perf.profile import PROFILE_VERSION
from spark_cnn.perf.timemodel import predict_batch_ms, predict_layers_ms
from spark_cnn.perf_tools.calibration import calibrate
from spark_cnn.perf_tools.calibration.conv_bench import LARGE_CONV_BATCH, LARGE_CONV_MAX_OUT_HW
from spark_cnn.perf_tools.calibration.gemm_bench import GEMM_ROWS, TOKEN_ROWS
from spark_cnn.perf_tools.validate import measure_batch_ms, validate
from spark_cnn.task.sidecar_env import GLIBC, allocator_of, sidecar_environment


@pytest.fixture(scope="module")
def calibrated_cpu(tmp_path_factory):
    """(profile, the cache folder calibrate() wrote it to). Tests copy the folder before changing anything in it."""
    cache = str(tmp_path_factory.mktemp("calibrated_cpu"))
    return calibrate("cpu", threads=1, budget_s=1.0, cache_dir=cache), cache


def test_time_model_charges_faults_only_for_glibcs_defaults(digits_cost_and_profile):
    cost, profile = digits_cost_and_profile
    no_faults = dataclasses.replace(profile, fault_us_per_page=0.0)
    retained = predict_batch_ms(cost, profile, 4096)  # default: the sidecar's allocator
    assert retained == pytest.approx(predict_batch_ms(cost, no_faults, 4096), rel=1e-3)
    assert predict_batch_ms(cost, profile, 4096, allocator=GLIBC) > retained
    with pytest.raises(ConfigError, match="allocator"):
        predict_layers_ms(cost, profile, 2, allocator="jemalloc")


@pytest.fixture(scope="module")
def digits_cost_and_profile(calibrated_cpu):
    profile = dataclasses.replace(calibrated_cpu[0], fault_us_per_page=1.0)  # whatever this host measured: fixed
    return analyse(DigitsCNN(), (3, 32, 32)), profile


def test_isolated_validation_runs_the_sidecars_runner_with_its_allocator(digits_cost_and_profile):
    _, profile = digits_cost_and_profile
    result = validate(DIGITS_FACTORY, [2], profile, input_shape=(3, 32, 32), repeats=2, warmup=1, sweeps=1,
                      isolate=True)
    assert result["protocol"]["isolated"] is True
    assert result["allocator"] == allocator_of(sidecar_environment())  # checked against the worker's own
    (point,) = result["points"]
    assert point["measured_ms"] > 0 and point["predicted_ms"] > 0
    assert result["pick"]["batch_size"] == 2 and result["pick"]["fraction_of_best"] == 1.0


def test_cpu_clock_times_the_computing_thread(tmp_path):
    ms, _ = measure_batch_ms(DigitsCNN(), (3, 32, 32), 2, repeats=2, warmup=1, clock="cpu")
    assert ms > 0
    with pytest.raises(ConfigError, match="clock"):
        measure_batch_ms(DigitsCNN(), (3, 32, 32), 2, repeats=1, warmup=0, clock="sundial")
    profile = calibrate("cpu", threads=1, budget_s=1.0, cache_dir=str(tmp_path), clock="cpu")
    assert any(note.startswith("clock: cpu") for note in profile.notes)
    with pytest.raises(ConfigError, match="clock"):
        calibrate("cpu", threads=1, budget_s=1.0, cache_dir=str(tmp_path), refresh=True, clock="sundial")
    with pytest.raises(ConfigError, match="one torch thread|threads=1"):
        calibrate("cpu", threads=2, budget_s=1.0, cache_dir=str(tmp_path), refresh=True, clock="cpu")


def test_isolated_validation_reports_the_measuring_process_error_as_its_own(digits_cost_and_profile):
    # the worker builds the model by name: its ModelError crosses the process boundary as a ModelError
    _, profile = digits_cost_and_profile
    with pytest.raises(ModelError, match="no_such_module"):
        validate("no_such_module:factory", [1], profile, module=DigitsCNN(), input_shape=(3, 32, 32), repeats=1,
                 warmup=0, sweeps=1, isolate=True)


def test_calibrate_is_cached_and_refreshable(calibrated_cpu, tmp_path):
    measured, cache = calibrated_cpu  # calibrate() measured it and wrote it to `cache`
    shutil.copytree(cache, tmp_path, dirs_exist_ok=True)
    threads = torch.get_num_threads()
    first = calibrate("cpu", threads=1, budget_s=1.0, cache_dir=str(tmp_path))
    assert first.created == measured.created  # read from the cache, not measured again
    assert first.threads == 1 and first.conv and first.gemm and first.curves
    # each section times its first point whatever the budget: the large batch and every GEMM row count
    large = [p for p in first.conv if p["batch"] == LARGE_CONV_BATCH]
    assert large and all(p["groups"] > 1 or p["out_hw"] <= LARGE_CONV_MAX_OUT_HW for p in large)
    rows = {g["rows"] for g in first.gemm}
    assert set(GEMM_ROWS) <= rows <= set(GEMM_ROWS) | set(TOKEN_ROWS) and {2, 4} <= set(GEMM_ROWS)
    # a 1 s budget still times each section's first point: 10.8 s of wall time once on the 2-core Xeon guest
    # beside two other test workers; a calibration that ignored its budget takes the default one's 34-45 s
    assert first.calibration_s < 20
    # pytest runs with glibc's malloc defaults: the benchmarks ran in a child with the sidecar's settings
    assert allocator_of() == GLIBC and "allocator: retained" in first.notes
    assert first.fault_us_per_page > 0  # fresh pages are probed with explicit mappings, not through malloc
    path = tmp_path / f"{first.key}.json"
    assert path.exists()
    assert calibrate("cpu", threads=1, budget_s=1.0, cache_dir=str(tmp_path)).created == first.created
    path.write_text(path.read_text().replace(f'"version": {PROFILE_VERSION}', '"version": 0'))
    refreshed = calibrate("cpu", threads=1, budget_s=1.0, cache_dir=str(tmp_path))  # stale: measured again
    assert torch.get_num_threads() == threads  # restored after measuring
    assert refreshed.version == PROFILE_VERSION and refreshed.created >= first.created
    assert json.loads(path.read_text())["version"] == PROFILE_VERSION  # and cached again
