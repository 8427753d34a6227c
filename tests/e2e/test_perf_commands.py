"""`spark-cnn profile` and `spark-cnn plan` end to end (a short calibration; no accuracy thresholds here: the
model's error is measured by the validation runs recorded in docs/perf-model-journal.md)."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.e2e


def test_profile_validates_exports_and_plan_uses_the_same_calibration_here_and_from_the_file(spark_cnn, tmp_path):
    out, png, exported = tmp_path / "profile.json", tmp_path / "profile.png", tmp_path / "device.json"
    # the shared test host is rarely quiet: the repeatability check runs and is recorded, and a noisy
    # calibration is kept with its spread (only --strict refuses it)
    result = spark_cnn("profile", "--model", "mobilenet_v3_small", "--batch-sizes", "1,4", "--validate",
                       "--calibration-seconds", "3", "--json", str(out), "--plot", str(png), "--export",
                       str(exported))
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
    assert f"to {exported}" in result.stdout and "calibration cached:" in result.stdout
    device = json.loads(exported.read_text())
    assert device["key"] == data["device"] and device["host"] and device["torch_version"] and device["version"]
    assert device["load"]["cores"] >= 1 and 0 <= device["load"]["others_cpu_share"] <= 1
    assert device["repeatability"]["points"] >= 1 and device["repeatability"]["attempts"] >= 1

    plan = spark_cnn("plan", "--model", "mobilenet_v3_small", "--images", "10000", "--executors", "2",
                     "--cores", "4", "--json", str(tmp_path / "plan.json"))
    assert plan.returncode == 0, plan.stderr[-3000:]
    planned = json.loads((tmp_path / "plan.json").read_text())
    assert planned["bottleneck"] in planned["stages_images_per_s_per_executor"]
    # wall_s is printed to a tenth of a second: a fast plan (a few seconds) differs from images/rate by the rounding
    assert planned["wall_s"] == pytest.approx(10000 / planned["images_per_s"], rel=0.01, abs=0.051)
    assert planned["device"] == data["device"]  # the profile calibrated above, reused

    # the exported file plans on any host: one core per executor instead of four
    one = spark_cnn("plan", "--model", "mobilenet_v3_small", "--images", "10000", "--executors", "2", "--cores", "1",
                    "--device-profile", str(exported), "--json", str(tmp_path / "one.json"))
    assert one.returncode == 0, one.stderr[-3000:]
    from_file = json.loads((tmp_path / "one.json").read_text())
    assert from_file["profile"]["file"] == str(exported) and from_file["batch_size"] == planned["batch_size"]
    assert planned["images_per_s"] == pytest.approx(4 * from_file["images_per_s"], rel=0.01)
    assert "img/s per executor" in one.stdout and "in all (2 x)" in one.stdout and device["host"] in one.stdout

    exported.write_text(json.dumps({**device, "version": device["version"] + 1}))
    refused = spark_cnn("plan", "--model", "mobilenet_v3_small", "--images", "10", "--executors", "1",
                        "--device-profile", str(exported))
    assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1
    assert f"version {device['version'] + 1}" in refused.stderr and "--export" in refused.stderr


def test_validate_measures_models_against_the_time_model(spark_cnn, tmp_path):
    from spark_cnn.perf_tools.calibration import calibrate

    cache, out = tmp_path / "profiles", tmp_path / "validation.json"
    profile = calibrate("cpu", budget_s=3.0, cache_dir=str(cache))  # the command finds it cached
    # one batch size: several, in order, are checked by tests/unit/perf (validate) and by the zoo run below
    result = spark_cnn("validate", "--models", "mobilenet_v3_small", "--batch-sizes", "2", "--sweeps", "1",
                       "--repeats", "2", "--cache-dir", str(cache), "--json", str(out))
    assert result.returncode == 0, result.stderr[-3000:]
    data = json.loads(out.read_text())
    assert data["profile"] == profile.key and [p["key"] for p in data["profiles"]] == [profile.key]
    (measured,) = data["results"]
    assert measured["model"] == "mobilenet_v3_small" and measured["protocol"]["isolated"] is True
    assert [p["batch_size"] for p in measured["points"]] == [2]
    assert all(p["measured_ms"] > 0 and p["predicted_ms"] > 0 for p in measured["points"])
    assert f"profile {profile.key}: calibrated" in result.stdout
    assert "mobilenet_v3_small: MAPE" in result.stdout and "| mobilenet_v3_small |" in result.stdout

    # the zoo under a budget that holds only its smallest network (0.08 GFLOPs; mobilenet_v3_small's 0.11 is out),
    # each point and the layers in a fresh process: the choice among many networks and the summary over them are
    # tests/unit/perf/test_perf_zoo.py's; a second network here only repeated the same three processes
    sweep, table = tmp_path / "zoo.json", tmp_path / "zoo.md"
    zoo = spark_cnn("validate", "--zoo", "--max-gflops", "0.1", "--batch-sizes", "1,2", "--sweeps", "1",
                    "--repeats", "2", "--attribute-at", "2", "--cache-dir", str(cache),
                    "--json", str(sweep), "--markdown", str(table))
    assert zoo.returncode == 0, zoo.stderr[-3000:]
    stored = json.loads(sweep.read_text())
    assert sorted(stored["models"]) == ["shufflenet_v2_x0_5"] and not stored["failed"]
    for entry in stored["models"].values():
        assert {b: len(ms) for b, ms in entry["runs"].items()} == {"1": 1, "2": 1}
        assert entry["allocator"] == "retained" and entry["layers"]["ms"]["<normalise>"] > 0
    text = table.read_text()
    assert "1 networks under 0.1 GFLOPs" in text and "| shufflenet_v2_x0_5 |" in text
    assert "Per operator kind over the zoo" in text and "| contiguous |" in text  # shufflenet's channel shuffle
