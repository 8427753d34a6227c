"""A GPU node's CPU budget from a bench run: CPU beyond decoding by process and cores per 1k images/s (pure)."""

from __future__ import annotations

import pytest

from spark_cnn.bench import report, suite
from spark_cnn.bench.device_budget import (
    TARGET_FRAMEWORK_MS_PER_IMAGE,
    cores_for,
    device_budget,
    steady_rate,
    steady_state,
)

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


def test_two_jobs_of_one_session_split_cpu_per_image_at_steady_state_from_cpu_per_job():
    # the JVM: ~2 s per job whatever its size (issue 36's measurement), the sidecar: 1.6 ms per image
    short = {"jvm": 2.0, "python_worker": 0.3, "sidecar": 3.3}
    long = {"jvm": 2.1, "python_worker": 1.1, "sidecar": 13.1}
    steady = steady_state(short, 2048, long, 8192)
    assert steady["ms_per_image"]["jvm"] == pytest.approx(0.016, abs=1e-3)
    assert steady["ms_per_image"]["sidecar"] == pytest.approx(1.595, abs=1e-3)
    assert steady["per_job_s"]["jvm"] == pytest.approx(1.967, abs=1e-3)
    assert steady["ms_per_image"]["total"] == pytest.approx(sum(
        v for k, v in steady["ms_per_image"].items() if k != "total"), abs=2e-3)
    warmer = steady_state({"jvm": 2.0}, 2048, {"jvm": 1.8}, 8192)  # the second job's JIT was warmer
    assert warmer["ms_per_image"]["jvm"] == 0.0 and warmer["per_job_s"]["jvm"] == 2.0
    with pytest.raises(ValueError, match="more images"):
        steady_state(short, 2048, long, 2048)


def test_the_budget_takes_steady_state_and_the_sidecars_own_decoding_cpu_where_it_has_them():
    details = {"limit": {"decode_per_s_one_core": 1000.0, "images_per_s": 2000.0, "cores": 2,
                         "model_per_s_by_threads": {}},
               "spark_cnn_sidecar_decode": {
                   "images_per_s": 900.0, "images": 8192, "decode": ["sidecar"], "decode_cpu_s": 11.0,
                   "cpu_ms_per_image": {"jvm": 0.27, "python_worker": 0.13, "sidecar": 1.65, "total": 2.05},
                   "steady_state": {"ms_per_image": {"jvm": 0.02, "python_worker": 0.12, "sidecar": 1.6,
                                                     "total": 1.74},
                                    "per_job_s": {"jvm": 2.0, "total": 2.1}, "images": [2048, 8192],
                                    "sidecar_decode_ms_per_image": 1.3}},
               "spark_cnn": {"images_per_s": 800.0, "cpu_ms_per_image": TASK_CPU, "decode": ["task"]}}
    budget = suite._entry("2 CPU cores", "sim:resnet50-h200", 8192, details)["device_budget"]
    sidecar = budget["spark_cnn_sidecar_decode"]
    assert sidecar["basis"] == "steady state" and sidecar["decode_ms_per_image"] == 1.3
    assert sidecar["framework_cores_per_1k_img_s"] == pytest.approx(0.44)  # 1.74 - 1.3, not 1.74 - the limit's 1.0
    assert sidecar["beyond_decoding_ms_per_image"]["sidecar"] == pytest.approx(0.3)
    assert sidecar["decode_measured_in"] == "the sidecar's decoding threads" and sidecar["per_job_cpu_s"] == 2.1
    task = budget["spark_cnn"]  # tasks decoded: no measured decoding, no shorter job: the limit's, whole run
    assert task["basis"] == "whole run" and task["decode_ms_per_image"] == 1.0
    text = report.table(suite._entry("2 CPU cores", "sim:resnet50-h200", 8192, details))
    assert "spark_cnn_sidecar_decode: steady state (a shorter job in the same session; 2.10 CPU-s per job" in text
    assert "decoding 1.30 ms per image, measured in the sidecar's decoding threads" in text
    assert sidecar["framework_ms_per_image_at_limit_decode"] == pytest.approx(0.74)  # 1.74 - the limit's 1.0
    assert "(with the limit's decoding instead: 0.74 ms of framework)" in text


def test_every_model_runs_a_shorter_job_of_a_quarter_of_its_images():
    assert suite.short_job_images("resnet18", 8192) == 2048  # a real model: its steady rate
    assert suite.short_job_images("sim:resnet50-h200", 8192) == 2048
    assert suite.short_job_images(suite.IDENTITY_MODEL, 4000) == 960  # a quarter, in whole folders of 64
    assert suite.short_job_images("sim:resnet50-h200", 192) == 0  # the quick bench: too short to split


def test_on_a_gpu_all_of_the_sidecars_cpu_is_framework_even_what_it_spends_driving_nvjpeg():
    details = {"limit": {"decode_per_s_one_core": 1000.0, "images_per_s": 2000.0, "cores": 2,
                         "model_per_s_by_threads": {}},
               "spark_cnn_sidecar_decode": {
                   "images_per_s": 9000.0, "images": 8192, "decode": ["gpu"], "decode_cpu_s": 0.4,
                   "cpu_ms_per_image": {"jvm": 0.02, "python_worker": 0.12, "sidecar": 0.15, "total": 0.29}}}
    budget = suite._entry("16 CPU cores", "sim:resnet50-h200", 8192, details)["device_budget"]
    gpu = budget["spark_cnn_sidecar_decode"]
    assert gpu["decode_ms_per_image"] == 0.0 and gpu["framework_cores_per_1k_img_s"] == pytest.approx(0.29)
    assert gpu["decode_measured_in"].startswith("the device")


def test_with_rounds_the_budget_shows_each_rounds_framework_cost_against_the_target():
    def round_with(sidecar_ms: float) -> dict:
        return {"limit": {"decode_per_s_one_core": 1000.0, "images_per_s": 2000.0, "cores": 2,
                          "model_per_s_by_threads": {}},
                "spark_cnn_sidecar_decode": {"images_per_s": 900.0 - 100 * sidecar_ms, "decode": ["sidecar"],
                                             "cpu_ms_per_image": {"jvm": 0.1, "sidecar": 1.0 + sidecar_ms,
                                                                  "total": 1.1 + sidecar_ms}}}
    entry = suite._entry("2 CPU cores", "sim:resnet50-h200", 8192, [round_with(0.1), round_with(0.3), round_with(0.2)])
    assert entry["framework_ms_per_image_by_round"] == [
        {"spark_cnn_sidecar_decode": pytest.approx(v)} for v in (0.2, 0.4, 0.3)]
    assert entry["device_budget"]["spark_cnn_sidecar_decode"]["framework_cores_per_1k_img_s"] == pytest.approx(0.3)
    text = report.table(entry)
    assert "spark_cnn_sidecar_decode: framework ms per image by round 0.20 0.40 0.30 (<= 0.3 in 2 of 3)" in text


def test_two_jobs_give_the_rate_a_long_job_sustains_and_what_each_job_costs_besides():
    steady = steady_rate(1024, 4.5, 4096, 14.1)  # 3072 more images in 9.6 more seconds
    assert steady["images_per_s"] == pytest.approx(320.0)
    assert steady["job_s"] == pytest.approx(4.5 - 1024 / 320.0)
    assert steady_rate(1024, 4.5, 4096, 4.4) == {"images_per_s": None, "job_s": None}  # noise, not a rate


def test_the_limit_target_is_also_read_at_steady_state_within_each_round():
    def spark_cnn(rate, steady):
        return {"images_per_s": rate, "images": 4096, "cpu_ms_per_image": {"total": 7.0},
                "steady_state": {"images_per_s": steady, "job_s": 1.2, "images": [1024, 4096],
                                 "ms_per_image": {"jvm": 0.45, "python_worker": 2.7, "sidecar": 3.9, "other": 0.0,
                                                  "total": 7.05},
                                 "per_job_s": {}}}

    rounds = [{"limit": {"images_per_s": 400.0}, "spark_cnn": spark_cnn(300.0, 368.0)},
              {"limit": {"images_per_s": 350.0}, "spark_cnn": spark_cnn(290.0, 320.0)},
              {"limit": {"images_per_s": 380.0}, "spark_cnn": spark_cnn(310.0, 350.0)}]
    entry = suite._entry("2 CPU cores", "mobilenet_v3_small", 4096, rounds)
    assert entry["steady_state_rates"] == {"spark_cnn": [368.0, 320.0, 350.0]}
    text = report.table(entry)
    # per round 0.75, 0.83, 0.82 measured; 0.92, 0.91, 0.92 at steady state: medians 0.82 and 0.92
    assert "spark_cnn / limit                  0.82  (>= 0.9: MISSED, missed in 3 of 3 rounds (min 0.75))" in text
    assert "\n    the same at steady state         0.92  (>= 0.9: met, met in every round (min 0.91))" in text
    assert ("spark_cnn at steady state: 350.0 img/s (rounds 320.0-368.0), from jobs of 1024 and 4096 images"
            in text)
    assert "each job costs 1.20 s besides; CPU ms an image: jvm 0.45, python_worker 2.70, sidecar 3.90, total 7.05" \
        in text
