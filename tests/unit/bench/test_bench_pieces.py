"""`spark-cnn bench` pieces that need no Spark: dataset, limit formula, run sizing, memory sampling, report."""

from __future__ import annotations

import io
import os

import pytest
from PIL import Image

from spark_cnn.bench import dataset, report, suite
from spark_cnn.bench.variants import pipeline_limit


def test_jpegs_are_distinct_320px_crops_of_both_packages_photos():
    names = dataset.source_photos()
    assert any(n.startswith("skimage:") for n in names) and any(n.startswith("sklearn:") for n in names)
    files = dataset.make_jpegs(6)
    assert len(set(files)) == 6
    for data in files:
        with Image.open(io.BytesIO(data)) as image:
            assert (image.format, image.size, image.mode) == ("JPEG", (320, 320), "RGB")


def test_input_folder_holds_exactly_the_images_asked_for_as_hard_links(tmp_path, monkeypatch):
    monkeypatch.setattr(dataset, "DATASET_IMAGES", 8)
    folder = dataset.input_dir(20, str(tmp_path))
    files = dataset.input_files(folder)
    assert len(files) == 20
    assert sorted(os.listdir(folder)) == ["_COMPLETE", "pass0", "pass1", "pass2"]  # Spark skips `_` names
    source = dataset.dataset_files(dataset.dataset_dir(str(tmp_path)))
    assert os.stat(files[0]).st_ino == os.stat(source[0]).st_ino  # the same bytes, read again
    assert dataset.input_dir(20, str(tmp_path)) == folder  # cached


def test_limit_is_the_cores_over_the_core_seconds_each_image_needs():
    # The figures: decode 184 img/s on a core, the model 117 img/s on one thread, 196 on two.
    assert pipeline_limit(184.0, {1: 117.0, 2: 196.0}, 2) == pytest.approx(2 / (1 / 184 + 1 / 117))
    # Two threads that scale perfectly cost the same core-seconds as one: the limit does not change.
    assert pipeline_limit(100.0, {1: 50.0, 2: 100.0}, 2) == pytest.approx(2 / (1 / 100 + 1 / 50))
    # Decoding for free leaves the model on every core.
    assert pipeline_limit(1e12, {1: 50.0}, 4) == pytest.approx(200.0)


def test_run_size_gives_every_variant_the_steady_seconds_at_the_limit_rate():
    full = suite.BenchConfig()
    images = suite.images_for(100.0, full)
    assert images >= 100.0 * suite.MIN_STEADY_S and images % suite.ROUND_IMAGES_TO == 0
    assert suite.images_for(100.0, suite.BenchConfig(images=500)) == 500
    assert suite.images_for(100.0, suite.BenchConfig(quick=True)) == suite.QUICK_IMAGES


def test_report_names_ratios_memory_and_targets(tmp_path):
    entry = {"machine": "2 CPU cores", "model": "mobilenet_v3_small", "images": 256,
             "results": {"bare": 100.0, "row": 50.0, "predict_batch_udf": 80.0, "spark_cnn": 140.0, "limit": 150.0},
             "memory_mb": {"bare": 900.0, "row": 2500.0, "predict_batch_udf": 2600.0, "spark_cnn": 2000.0},
             "details": {}}
    text = report.table(entry)
    assert "0.36" in text  # row / spark_cnn
    verdicts = {line.split(" / ")[1].split()[0]: line.rsplit(": ", 1)[1] for line in report.target_lines(entry)}
    assert verdicts == {"limit": "met)", "predict_batch_udf": "MISSED)", "bare": "met)", "pbu": "met)"}
    png = tmp_path / "bench.png"
    report.plot(str(png), [entry, {**entry, "model": "resnet18"}])
    assert png.read_bytes()[:4] == b"\x89PNG"
    report.write_json(str(tmp_path / "one.json"), [entry])
    assert (tmp_path / "one.json").read_text().lstrip().startswith("{")


def test_report_shows_cpu_per_image_by_kind_and_the_near_free_models_own_targets():
    entry = {"machine": "2 CPU cores", "model": "identity", "images": 256,
             "results": {"bare": 500.0, "predict_batch_udf": 200.0, "spark_cnn": 450.0, "limit": 600.0},
             "memory_mb": {},
             "cpu_ms_per_image": {"bare": {"driver": 3.1, "total": 3.1},
                                  "spark_cnn": {"jvm": 1.25, "python_worker": 2.5, "sidecar": 0.5, "total": 4.25}},
             "details": {"limit": {"decode_per_s_one_core": 300.0, "model_per_s_by_threads": {}, "cores": 2}}}
    text = report.table(entry)
    lines = text.splitlines()
    header = next(i for i, line in enumerate(lines) if line.strip().startswith("CPU ms per image"))
    assert lines[header].split()[4:] == ["jvm", "python_worker", "sidecar", "driver", "total"]
    assert lines[header + 1].split() == ["bare", "3.10", "3.10"]
    assert lines[header + 2].split() == ["spark_cnn", "1.25", "2.50", "0.50", "4.25"]
    assert "2 cores x decode on a core" in text and "alone: 300.0 img/s on one core (3.33 CPU ms per image)" in text
    verdicts = {line.split()[2]: line.rsplit(": ", 1)[1] for line in report.target_lines(entry)}
    # The real models' 0.9 of the limit does not apply; the near-free model's 0.85 and 2x predict_batch_udf do.
    assert verdicts == {"decode-only": "MISSED)", "predict_batch_udf": "met)"}


def test_report_gives_each_spark_cnn_variants_cpu_beyond_decoding_for_the_near_free_model_only():
    cpu = {"spark_cnn": {"jvm": 0.4, "python_worker": 2.0, "sidecar": 0.6, "total": 3.0},
           "spark_cnn_sidecar_decode": {"jvm": 0.4, "python_worker": 0.2, "sidecar": 2.9, "total": 3.5}}
    entry = {"machine": "2 CPU cores", "model": "identity", "images": 256, "memory_mb": {},
             "results": {"spark_cnn": 450.0, "spark_cnn_sidecar_decode": 400.0, "limit": 800.0},
             "cpu_ms_per_image": cpu,
             "details": {"limit": {"decode_per_s_one_core": 400.0, "model_per_s_by_threads": {}, "cores": 2}}}
    text = report.table(entry)
    # 1000 / 400 = 2.5 ms of decoding per image on one core; the rest is the framework's
    assert "spark_cnn: 0.50 CPU ms per image beyond decoding (3.00 - 2.50)" in text
    assert "spark_cnn_sidecar_decode: 1.00 CPU ms per image beyond decoding (3.50 - 2.50)" in text
    assert any(line.split()[:3] == ["spark_cnn_sidecar_decode", "400.0", "0.89"] for line in text.splitlines())
    real_model = {**entry, "model": "mobilenet_v3_small"}  # its limit includes the model: no such line
    assert "beyond decoding" not in report.table(real_model)


def test_the_sidecar_decode_variant_is_spark_cnn_with_the_sidecar_decoding_run_when_asked_for_only(monkeypatch):
    from spark_cnn.bench import variants

    calls = []
    monkeypatch.setattr(variants, "run_spark_cnn", lambda task, decode="auto": calls.append((task, decode)))
    variants.RUNNERS[variants.SIDECAR_DECODE_VARIANT]("task")
    assert calls == [("task", "sidecar")]
    assert variants.SIDECAR_DECODE_VARIANT in variants.VARIANTS
    assert variants.SIDECAR_DECODE_VARIANT not in variants.DEFAULT_VARIANTS
    assert suite.BenchConfig().variants == variants.DEFAULT_VARIANTS


def test_limit_without_model_rates_is_the_decode_only_rate_of_the_cores():
    assert pipeline_limit(300.0, {}, 2) == pytest.approx(600.0)


def test_the_near_free_model_loads_as_torchscript_with_the_default_preprocessing(tmp_path):
    import torch

    from spark_cnn.bench.tiny import save_identity_torchscript
    from spark_cnn.bench.variants import load_model
    from spark_cnn.imaging.preprocess import Preprocessing
    from spark_cnn.models.resolve import resolve_endpoint
    from spark_cnn.models.spec import ModelSpec

    path = save_identity_torchscript(str(tmp_path / "identity.pt"))
    spec = ModelSpec(path)
    assert spec.kind == "torchscript"
    endpoint = resolve_endpoint(spec).endpoint  # what the job, the sidecar and the limit load
    assert (endpoint.preprocessing.resize, endpoint.preprocessing.crop) == (Preprocessing().resize, 224)
    user = load_model(path, None)  # what the bare loop and the Spark UDFs load
    assert user(torch.zeros(2, 3, 224, 224)).shape == (2, 10)


def test_the_limits_lines_give_the_median_window_and_the_range_of_every_window():
    windows = [{"decode_per_s_per_core": d, "model_per_s_one_thread": m, "images_per_s": pipeline_limit(d, {1: m}, 2)}
               for d, m in ((400.0, 200.0), (380.0, 230.0), (420.0, 180.0))]
    median = sorted(windows, key=lambda w: w["images_per_s"])[1]
    limit = {"decode_per_s_one_core": 500.0, "cores": 2, "model_per_s_by_threads": {1: 250.0, 2: 360.0},
             "model_batch_size": 32, "images_per_s": median["images_per_s"], "images_per_s_alone": 330.0,
             "side_by_side": {**median, "decoders": 1, "windows": windows}}
    side_line = report.limit_lines(limit, ours=250.0)[1]
    rates = [w["images_per_s"] for w in windows]
    assert f"median of 3 windows {min(rates):.1f}-{max(rates):.1f} img/s" in side_line
    assert f"= {median['images_per_s']:.1f} img/s" in side_line
    # One window (a quick run, or a result from before windows): no range to give.
    one = {**limit, "side_by_side": {**median, "decoders": 1, "windows": windows[:1]}}
    assert "windows" not in report.limit_lines(one, ours=250.0)[1]
