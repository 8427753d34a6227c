"""`spark-cnn bench-sidecar` runs end to end (a smoke run: tiny windows, no thresholds) and cleans up."""

from __future__ import annotations

import json
import os

import pytest

from spark_cnn.task.procs import cmdline

pytestmark = pytest.mark.e2e


def _bench_sidecars() -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()
            and any(arg.startswith("bench-sidecar-") for arg in cmdline(int(p)))]


def test_bench_sidecar_reports_on_off_and_device_only(spark_cnn, tmp_path):
    out = tmp_path / "bench.json"
    result = spark_cnn("bench-sidecar", "--model", "mobilenet_v3_small", "--clients", "2", "--seconds", "3",
                       "--warmup", "1", "--rounds", "1", "--json", str(out))
    assert result.returncode == 0, result.stderr[-3000:]
    data = json.loads(out.read_text())
    assert data["on"] > 0 and data["off"] > 0 and data["device_only"] > 0
    assert data["batch_size"] in (1, 2, 4, 8, 16, 32, 64) and data["device"] == "cpu"
    assert data["input_shape"] == [224, 224, 3] and data["bytes_per_image"] == 224 * 224 * 3
    assert data["on_gb_per_s"] == round(data["on"] * 224 * 224 * 3 / 1e9, 3)
    modes = {r["mode"]: r for r in data["rounds"]}
    assert modes["off"]["mean_batch_size"] == 1.0  # each request of one image ran alone
    assert modes["on"]["mean_batch_size"] > 1.0    # requests of two clients were merged
    # the online tuner sizes the auto batch ("on") and reports its state; a fixed batch ("off") has none
    assert modes["off"]["tuning"] is None and modes["on"]["tuning"]["batches"] >= 0
    assert modes["on"]["tuning"]["best"] == data["batch_size"] == modes["on"]["batch_size"]
    assert "tuner " in result.stdout
    assert "on/off" in result.stdout
    assert _bench_sidecars() == []
