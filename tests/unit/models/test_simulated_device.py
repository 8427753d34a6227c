"""The simulated device: its latency curve, and a model that waits that long without using the CPU."""

from __future__ import annotations

import json
import threading
import time

import numpy as np
import pytest
import torch

from spark_cnn.errors import ConfigError
from spark_cnn.models.device_curve import FLOOR_MS, LatencyCurve, curve_from_json, parse_curve
from spark_cnn.models.simulated import SimulatedDevice, takes_raw_pixels
from spark_cnn.models.spec import ModelSpec

# A forward of a few ms: long enough that the wait, not Python's overhead, is what a call costs.
TEST_CURVE = "8+0.05n"


def test_the_built_in_h200_curve_goes_through_its_two_measured_points():
    curve = parse_curve("resnet50-h200")
    assert curve.images_per_s(64) == pytest.approx(6625.0)
    assert curve.images_per_s(128) == pytest.approx(7757.0)
    assert curve.ms(64) < curve.ms(96) < curve.ms(128)  # interpolated between them
    assert curve.ms(256) == pytest.approx(16.501 + (16.501 - 9.660) * 2, rel=1e-3)  # extrapolated along them
    assert curve.ms(1) == pytest.approx(9.660 - (16.501 - 9.660) / 64 * 63, rel=1e-3)


def test_a_line_a_profile_file_and_one_point_give_their_curves(tmp_path):
    assert parse_curve("2+0.5n").ms(10) == pytest.approx(7.0)
    assert parse_curve("2.5 + 0.25*n").ms(4) == pytest.approx(3.5)
    profile = tmp_path / "profile.json"  # spark-cnn profile --json: measured times win over predicted ones
    profile.write_text(json.dumps({"points": [{"batch_size": 8, "predicted_ms": 99.0, "measured_ms": 4.0},
                                              {"batch_size": 32, "predicted_ms": 10.0}]}))
    curve = parse_curve(str(profile))
    assert curve.ms(8) == 4.0 and curve.ms(32) == 10.0 and curve.ms(20) == pytest.approx(7.0)
    assert LatencyCurve(((10, 5.0),)).ms(20) == pytest.approx(10.0)  # one point: time in proportion
    assert LatencyCurve(((64, 1.0), (128, 10.0))).ms(1) == FLOOR_MS  # never free, however far extrapolated


@pytest.mark.parametrize("bad", ["h100-resnet", "2+n", "-1+0.1n", ""])
def test_an_unknown_curve_is_refused_with_the_forms_it_takes(bad):
    with pytest.raises(ConfigError, match="resnet50-h200"):
        parse_curve(bad)


def test_bad_points_are_refused():
    with pytest.raises(ConfigError, match="distinct positive"):
        LatencyCurve(((8, 1.0), (8, 2.0)))
    with pytest.raises(ConfigError, match="lacks batch_size"):
        curve_from_json({"points": [{"batch_size": 8}]})


def test_sim_is_a_model_kind_checked_where_the_spec_is_made():
    assert ModelSpec("sim:resnet50-h200").kind == "simulated"
    with pytest.raises(ConfigError, match="not a simulated device"):
        ModelSpec("sim:nonesuch")
    with pytest.raises(ConfigError, match="no weights"):
        ModelSpec("sim:resnet50-h200", weights="random")


def test_the_model_returns_class_logits_after_the_curves_time_using_little_cpu():
    model = SimulatedDevice(parse_curve(TEST_CURVE))
    pixels = torch.zeros((32, 3, 224, 224), dtype=torch.uint8)
    assert model(pixels).shape == (32, 1000) and takes_raw_pixels(model)
    calls, expected_s = 10, parse_curve(TEST_CURVE).ms(32) / 1000.0
    wall, cpu = time.perf_counter(), time.process_time()  # process time: every thread of this process
    for _ in range(calls):
        model(pixels)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    assert wall >= calls * expected_s
    assert wall < calls * expected_s * 2.0 + 0.5  # ~the curve's time (a loaded host may stretch a sleep)
    assert cpu < 0.2 * wall, (cpu, wall)  # a forward that computed or spun would be charged here


def test_one_device_runs_one_batch_at_a_time_however_many_threads_submit():
    model = SimulatedDevice(parse_curve(TEST_CURVE))
    pixels = torch.zeros((8, 3, 32, 32), dtype=torch.uint8)
    started = time.perf_counter()
    threads = [threading.Thread(target=model, args=(pixels,)) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert time.perf_counter() - started >= 4 * parse_curve(TEST_CURVE).ms(8) / 1000.0


def test_the_runner_hands_the_simulated_device_uint8_pixels_and_never_normalises(monkeypatch):
    from spark_cnn.models.resolve import resolve_endpoint
    from spark_cnn.sidecar import runner as runner_module

    endpoint = resolve_endpoint(ModelSpec(f"sim:{TEST_CURVE}")).endpoint
    runner = runner_module.ModelRunner(endpoint, torch.device("cpu"))
    seen = []
    monkeypatch.setattr(runner_module, "normalise", lambda *a: pytest.fail("normalised on the host"))
    monkeypatch.setattr(runner.predictor, "module", lambda images: seen.append(images) or torch.zeros(len(images),
                                                                                                      1000))
    out = runner.run(np.zeros((4, 224, 224, 3), dtype=np.uint8))
    assert out["topk_label"].shape == (4, 5)
    assert seen[0].dtype == torch.uint8 and seen[0].shape == (4, 3, 224, 224)
