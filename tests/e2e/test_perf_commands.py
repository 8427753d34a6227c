"""`spark-cnn profile` and `spark-cnn plan` end to end (a short calibration; no accuracy thresholds here: the
model's error is measured by the validation runs recorded in docs/perf-model.md)."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.e2e


def test_profile_validates_and_plan_uses_the_same_calibration(spark_cnn, tmp_path):
    out, png = tmp_path / "profile.json", tmp_path / "profile.png"
    result = spark_cnn("profile", "--model", "mobilenet_v3_small", "--batch-sizes", "1,4", "--validate",
                       "--calibration-seconds", "6", "--json", str(out), "--plot", str(png))
    assert result.returncode == 0, result.stderr[-3000:]
    data = json.loads(out.read_text())
    assert {"model", "device", "points", "mape", "chosen_batch_size"} <= set(data)
    assert [p["batch_size"] for p in data["points"]] == [1, 4]
    for point in data["points"]:
        assert point["predicted_ms"] > 0 and point["measured_ms"] > 0
        assert point["error"] == pytest.approx((point["predicted_ms"] - point["measured_ms"]) / point["measured_ms"],
                                               abs=1e-3)
    assert data["mape"] >= 0 and data["chosen_batch_size"] in (1, 4)
    assert data["layers"] and data["layers"][0]["predicted_ms"] >= data["layers"][-1]["predicted_ms"]
    assert png.read_bytes().startswith(b"\x89PNG")
    assert "MAPE" in result.stdout and "costliest layers" in result.stdout

    plan = spark_cnn("plan", "--model", "mobilenet_v3_small", "--images", "10000", "--executors", "2",
                     "--cores", "4", "--json", str(tmp_path / "plan.json"))
    assert plan.returncode == 0, plan.stderr[-3000:]
    planned = json.loads((tmp_path / "plan.json").read_text())
    assert planned["bottleneck"] in planned["stages_images_per_s_per_executor"]
    assert planned["wall_s"] == pytest.approx(10000 / planned["images_per_s"], rel=0.01)
    assert planned["device"] == data["device"]  # the profile calibrated above, reused


def test_validate_measures_models_against_the_time_model(spark_cnn, tmp_path):
    from spark_cnn.perf.calibration import calibrate

    cache, out = tmp_path / "profiles", tmp_path / "validation.json"
    profile = calibrate("cpu", budget_s=3.0, cache_dir=str(cache))  # the command finds it cached
    result = spark_cnn("validate", "--models", "mobilenet_v3_small", "--batch-sizes", "1,2", "--sweeps", "1",
                       "--repeats", "2", "--cache-dir", str(cache), "--json", str(out))
    assert result.returncode == 0, result.stderr[-3000:]
    data = json.loads(out.read_text())
    assert data["profile"] == profile.key and [p["key"] for p in data["profiles"]] == [profile.key]
    (measured,) = data["results"]
    assert measured["model"] == "mobilenet_v3_small" and measured["protocol"]["isolated"] is True
    assert [p["batch_size"] for p in measured["points"]] == [1, 2]
    assert all(p["measured_ms"] > 0 and p["predicted_ms"] > 0 for p in measured["points"])
    assert f"profile {profile.key}: calibrated" in result.stdout
    assert "mobilenet_v3_small: MAPE" in result.stdout and "| mobilenet_v3_small |" in result.stdout

    # the zoo under a budget that holds its two smallest networks, each point and the layers in a fresh process
    sweep, table = tmp_path / "zoo.json", tmp_path / "zoo.md"
    zoo = spark_cnn("validate", "--zoo", "--max-gflops", "0.13", "--batch-sizes", "1,2", "--sweeps", "1",
                    "--repeats", "2", "--attribute-at", "2", "--cache-dir", str(cache),
                    "--json", str(sweep), "--markdown", str(table))
    assert zoo.returncode == 0, zoo.stderr[-3000:]
    stored = json.loads(sweep.read_text())
    assert sorted(stored["models"]) == ["mobilenet_v3_small", "shufflenet_v2_x0_5"] and not stored["failed"]
    for entry in stored["models"].values():
        assert {b: len(ms) for b, ms in entry["runs"].items()} == {"1": 1, "2": 1}
        assert entry["allocator"] == "retained" and entry["layers"]["ms"]["<normalise>"] > 0
    text = table.read_text()
    assert "2 networks under 0.13 GFLOPs" in text and "| shufflenet_v2_x0_5 |" in text
    assert "Per operator kind over the zoo" in text and "| contiguous |" in text  # shufflenet's channel shuffle
