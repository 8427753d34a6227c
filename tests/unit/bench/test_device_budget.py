"""A GPU node's CPU budget from a bench run: CPU beyond decoding by process and cores per 1k images/s (pure)."""

from __future__ import annotations

import pytest

from spark_cnn.bench import report, suite
from spark_cnn.bench.device_budget import TARGET_FRAMEWORK_MS_PER_IMAGE, cores_for, device_budget

TASK_CPU = {"jvm": 0.25, "python_worker": 1.9, "sidecar": 0.05, "driver": 0.01, "total": 2.21}
SIDECAR_CPU = {"jvm": 0.3, "python_worker": 0.2, "sidecar": 1.85, "driver": 0.01, "total": 2.36}


def test_decoding_comes_out_of_the_process_that_decodes_and_the_rest_is_cores_per_1k_img_s():
    task = device_budget(TASK_CPU, 1.6, "task", images_per_s=800.0)
    assert task["beyond_decoding_ms_per_image"] == {"jvm": 0.25, "python_worker": pytest.approx(0.3),
                                                    "sidecar": 0.05, "driver": 0.01}
    assert task["cores_per_1k_img_s"] == 2.21  # 2.21 ms of CPU an image, 1,000 images a second: 2.21 cores
    assert task["framework_cores_per_1k_img_s"] == pytest.approx(0.61)
    assert task["framework_target_met"] is False and task["cores_busy"] == pytest.approx(1.77)
    sidecar = device_budget(SIDECAR_CPU, 1.6, "sidecar")
    assert sidecar["beyond_decoding_ms_per_image"]["sidecar"] == pytest.approx(0.25)
    assert sidecar["beyond_decoding_ms_per_image"]["python_worker"] == 0.2
    assert device_budget(SIDECAR_CPU, 1.6, "gpu")["decode_place"] == "gpu"  # nvJPEG's place: also the sidecar's
    cheap = device_budget({"jvm": 0.1, "sidecar": 1.7, "total": 1.8}, 1.6, "sidecar")
    assert cheap["framework_target_met"] is (0.2 <= TARGET_FRAMEWORK_MS_PER_IMAGE)


def test_cores_for_a_rate_scale_with_cpu_per_image():
    assert cores_for(12_000, TARGET_FRAMEWORK_MS_PER_IMAGE) == 3.6  # the 12k img/s on <= 4 cores
    assert cores_for(12_000, 0.7) == 8.4


def test_a_simulated_devices_entry_carries_each_paths_budget_and_the_table_prints_it():
    details = {"limit": {"decode_per_s_one_core": 625.0, "images_per_s": 1250.0, "cores": 2,
                         "model_per_s_by_threads": {}},
               "spark_cnn": {"images_per_s": 800.0, "cpu_ms_per_image": TASK_CPU, "decode": ["task"]},
               "spark_cnn_sidecar_decode": {"images_per_s": 700.0, "cpu_ms_per_image": SIDECAR_CPU,
                                            "decode": ["sidecar"]}}
    entry = suite._entry("2 CPU cores", "sim:resnet50-h200", 512, details)
    budget = entry["device_budget"]
    assert set(budget) == {"spark_cnn", "spark_cnn_sidecar_decode"}
    assert budget["spark_cnn"]["decode_ms_per_image"] == 1.6  # 1000 / 625
    assert budget["spark_cnn_sidecar_decode"]["framework_cores_per_1k_img_s"] == pytest.approx(0.76)
    text = report.table(entry)
    row = next(line for line in text.splitlines() if line.split()[:2] == ["spark_cnn_sidecar_decode", "sidecar"])
    assert row.split()[-5:-2] == ["2.36", "0.76", "(<="] and row.endswith("MISSED)")
    assert "spark_cnn_sidecar_decode: 0.76 CPU ms per image beyond decoding (2.36 - 1.60)" in text
    assert not report.target_lines(entry)  # no model-limit target: the limit is decoding alone
    mixed = {**details, "spark_cnn": {**details["spark_cnn"], "decode": ["task", "sidecar"]}}
    assert set(suite._entry("m", "sim:resnet50-h200", 512, mixed)["device_budget"]) == {"spark_cnn_sidecar_decode"}
    assert "device_budget" not in suite._entry("m", "resnet18", 512, details)  # a real model: the limit has compute
