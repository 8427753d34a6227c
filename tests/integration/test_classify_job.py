"""The classify job on a real local Spark: outputs against direct torch, one row per file, errors, summary."""

from __future__ import annotations

import json
import os
from urllib.parse import urlparse

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
import torchvision
from PIL import Image
from torchvision import transforms

from spark_cnn.config import ClassifyConfig, InferenceOptions
from spark_cnn.errors import ConfigError, ImageError, InputError, ModelError
from spark_cnn.imaging.preprocess import Preprocessing
from spark_cnn.models.digits import DIGITS_FACTORY, DIGITS_PREPROCESSING, DigitsCNN
from spark_cnn.models.spec import ModelSpec
from spark_cnn.spark.classify_job import SUMMARY_FILE, classify
from tests.sample_images import real_image_files, write_files

pytestmark = pytest.mark.spark


def _files_under(root: str) -> set[str]:
    return {os.path.join(d, f) for d, _, names in os.walk(root) for f in names if not f.startswith((".", "_"))}


def _read_output(path: str) -> dict[str, dict]:
    rows = pq.read_table(path).to_pylist()
    by_path = {urlparse(r["path"]).path: r for r in rows}
    assert len(by_path) == len(rows), "a path appears twice in the output"
    return by_path


def _reference_logits(model: torch.nn.Module, path: str, prep) -> np.ndarray:
    """What a user would write with plain torchvision on the same file."""
    pipeline = transforms.Compose([transforms.Resize(prep.resize), transforms.CenterCrop(prep.crop),
                                   transforms.ToTensor(), transforms.Normalize(prep.mean, prep.std)])
    with Image.open(path) as image, torch.inference_mode():
        return model(pipeline(image.convert("RGB")).unsqueeze(0))[0].numpy()


def _jobs_run(spark) -> int:
    return len(spark.sparkContext.statusTracker().getJobIdsForGroup())


@pytest.mark.spark35
def test_torchvision_model_logits_match_torch_and_every_file_is_one_row(spark, mixed_folder, mobilenet_weights,
                                                                        tmp_path):
    output = str(tmp_path / "out")
    summary = classify(ClassifyConfig(mixed_folder, output, InferenceOptions(
        ModelSpec("mobilenet_v3_small", mobilenet_weights), logits=True, embeddings=True, top_k=3)), spark=spark)

    rows = _read_output(output)
    assert set(rows) == _files_under(mixed_folder)
    model = torchvision.models.mobilenet_v3_small()
    model.load_state_dict(torch.load(mobilenet_weights, weights_only=True))
    model.eval()
    prep = Preprocessing()
    for path, row in rows.items():
        if "/broken/" in path:
            assert row["error"] and row["label"] is None and row["topk"] is None and row["logits"] is None
            continue
        assert row["error"] is None, row["error"]
        expected = _reference_logits(model, path, prep)
        np.testing.assert_allclose(row["logits"], expected, rtol=1e-4, atol=1e-4)
        assert expected[row["label"]] == pytest.approx(expected.max(), abs=1e-4)  # argmax, up to float ties
        assert [p["score"] for p in row["topk"]] == sorted((p["score"] for p in row["topk"]), reverse=True)
        assert row["topk"][0]["score"] == pytest.approx(row["score"])
        assert len(row["embedding"]) == 1024  # the input of mobilenet_v3_small's last Linear
        assert row["label_name"] is None  # no --labels
    assert summary["images"] == len(rows) and summary["errors"] == 3 and summary["ok"] == len(rows) - 3
    assert summary["accuracy"] is None


def test_demo_digits_model_matches_torch_and_reaches_accuracy(spark, demo_assets, tmp_path):
    output = str(tmp_path / "digits")
    summary = classify(ClassifyConfig(demo_assets.images, output, InferenceOptions(
        ModelSpec(DIGITS_FACTORY, demo_assets.weights), labels=demo_assets.labels, logits=True)), spark=spark)

    rows = _read_output(output)
    assert set(rows) == _files_under(demo_assets.images) and len(rows) == 1797
    model = DigitsCNN()
    model.load_state_dict(torch.load(demo_assets.weights, weights_only=True))
    model.eval()
    sample = sorted(rows)[::60]  # every 60th file: all ten classes, quick to recompute
    for path in sample:
        np.testing.assert_allclose(rows[path]["logits"], _reference_logits(model, path, DIGITS_PREPROCESSING),
                                   rtol=1e-4, atol=1e-5)
        assert rows[path]["label_name"] == str(rows[path]["label"])
    assert summary["errors"] == 0 and summary["accuracy"] >= 0.95
    # auto: the CPU starts at 8 and the online tuner may move it by powers of two within 1..64
    assert summary["batch_size"] in (1, 2, 4, 8, 16, 32, 64) and summary["sidecars"]
    # the start is 8, or the model's pick once a test has calibrated this run's private device cache; what the
    # tuner measured depends on the machine's load (partial batches do not count); its presence does not
    assert all(s["tuning"]["start"] in (1, 2, 4, 8, 16, 32, 64) and "observed_images_per_s" in s["tuning"]
               for s in summary["sidecars"])
    for sidecar in summary["sidecars"]:
        assert {"host", "executor", "pid", "device", "socket", "requests", "batches", "mean_batch_size"} <= set(sidecar)
    assert sum(s["images"] for s in summary["sidecars"]) == 1797
    with open(os.path.join(output, SUMMARY_FILE)) as f:
        assert json.load(f)["images"] == 1797


def test_fixed_batch_size_and_summary_file(spark, demo_assets, tmp_path):
    folder = write_files(str(tmp_path / "in"), {k: v for k, v in real_image_files().items() if "digits" in k})
    summary_path = str(tmp_path / "summary.json")
    jobs_before = len(spark.sparkContext.statusTracker().getJobIdsForGroup())
    summary = classify(ClassifyConfig(folder, str(tmp_path / "out"), InferenceOptions(
        ModelSpec(DIGITS_FACTORY, demo_assets.weights), labels=demo_assets.labels, batch_size=2),
        summary=summary_path), spark=spark)
    # one Spark job, the write: the listing's groups are read by their own scan (no broadcast job for a small
    # listing), and the summary's counts were gathered while writing, so no job reads the output back
    assert len(spark.sparkContext.statusTracker().getJobIdsForGroup()) == jobs_before + 1
    with open(summary_path) as f:
        written = json.load(f)
    assert written == summary
    assert summary["images"] == 3 and summary["ok"] == 3 and summary["batch_size"] == 2
    assert all(s["mean_batch_size"] <= 2 for s in summary["sidecars"])


def test_on_error_fail_names_the_file_and_writes_nothing(spark, mixed_folder, demo_assets, tmp_path):
    output = tmp_path / "out"
    with pytest.raises(ImageError, match=r"broken/(truncated\.jpg|notes\.txt|empty\.png)"):
        classify(ClassifyConfig(mixed_folder, str(output), InferenceOptions(
            ModelSpec(DIGITS_FACTORY, demo_assets.weights), on_error="fail")), spark=spark)
    assert not output.exists()
    assert os.listdir(tmp_path) == [], "a staging directory was left behind"


@pytest.mark.parametrize("case", ["missing input", "unknown model", "weights do not fit", "output exists",
                                  "labels do not fit"])
def test_bad_configuration_stops_before_any_work(spark, case, demo_assets, mobilenet_weights, tmp_path):
    output = tmp_path / "out"
    spec, labels, folder = ModelSpec(DIGITS_FACTORY, demo_assets.weights), None, demo_assets.images
    expected = {"missing input": (InputError, "does not exist"), "unknown model": (ModelError, "unknown model"),
                "weights do not fit": (ModelError, "do not fit"), "output exists": (InputError, "--overwrite"),
                "labels do not fit": (ConfigError, "classes")}[case]
    if case == "missing input":
        folder = str(tmp_path / "nowhere")
    elif case == "unknown model":
        spec = ModelSpec("resnet_does_not_exist")
    elif case == "weights do not fit":
        spec = ModelSpec(DIGITS_FACTORY, mobilenet_weights)
    elif case == "output exists":
        output.mkdir()
        (output / "keep.txt").write_text("mine")
    else:
        labels = str(tmp_path / "labels.txt")
        with open(labels, "w") as f:
            f.write("a\nb\nc\n")
    jobs_before = _jobs_run(spark)
    with pytest.raises(expected[0], match=expected[1]):
        classify(ClassifyConfig(folder, str(output), InferenceOptions(spec, labels=labels)), spark=spark)
    assert _jobs_run(spark) == jobs_before, "a Spark job ran before the configuration error"
    if case == "output exists":
        assert (output / "keep.txt").read_text() == "mine"
    else:
        assert not output.exists()


def test_overwrite_replaces_the_output(spark, demo_assets, tmp_path):
    folder = write_files(str(tmp_path / "in"), {k: v for k, v in real_image_files().items() if "digits" in k})
    output = tmp_path / "out"
    output.mkdir()
    (output / "stale.parquet").write_bytes(b"old")
    classify(ClassifyConfig(folder, str(output), InferenceOptions(ModelSpec(DIGITS_FACTORY, demo_assets.weights)),
                            overwrite=True), spark=spark)
    assert not (output / "stale.parquet").exists()
    assert len(_read_output(str(output))) == 3


def test_sidecar_decoding_gives_the_same_rows_as_task_decoding(spark, mixed_folder, mobilenet_weights, tmp_path):
    spec = ModelSpec("mobilenet_v3_small", mobilenet_weights)
    classify(ClassifyConfig(mixed_folder, str(tmp_path / "task"), InferenceOptions(spec, logits=True)), spark=spark)
    summary = classify(ClassifyConfig(mixed_folder, str(tmp_path / "sidecar"),
                                      InferenceOptions(spec, logits=True, decode="sidecar")), spark=spark)
    by_task, by_sidecar = _read_output(str(tmp_path / "task")), _read_output(str(tmp_path / "sidecar"))
    assert set(by_task) == set(by_sidecar) == _files_under(mixed_folder)
    for path, row in by_task.items():
        other = by_sidecar[path]
        assert (row["error"] is None) == (other["error"] is None), (path, row["error"], other["error"])
        if row["error"] is None:
            np.testing.assert_allclose(other["logits"], row["logits"], rtol=1e-5, atol=1e-5)
            assert other["label"] == row["label"]
    assert summary["errors"] == 3
    # Files the sidecar could not decode still count as requests sent; the failed rows never reach a batch. The
    # task refuses files over the size guard rails (the empty one here) before sending them.
    assert sum(s["images"] for s in summary["sidecars"]) == len(by_task) - 1


def test_the_driver_jvm_maps_the_class_archive_make_built(spark):
    """`make` builds the archive of Spark's classes for this JDK and these jars (spark/jvm_archive.py); the
    session's driver JVM maps it (a JVM that refused it would map nothing of it, quietly)."""
    from pyspark import SparkContext

    from spark_cnn.spark import jvm_archive

    path = jvm_archive.archive_path()
    assert path and os.path.isfile(path), f"no class archive at {path}: python -m spark_cnn.spark.jvm_archive"
    with open(f"/proc/{SparkContext._gateway.proc.pid}/maps") as maps:
        assert path in maps.read()
