"""The notebook API on a real local Spark: cnn_udf and classify(df)/embed(df) against the job's task function
and plain torch, on image bytes and Spark image structs; bad images; the embed job with --layer; one sidecar."""

from __future__ import annotations

import os
from urllib.parse import urlparse

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
import torchvision
from PIL import Image
from torchvision import transforms

import spark_cnn
from spark_cnn.config import ClassifyConfig, InferenceOptions
from spark_cnn.errors import ConfigError, ModelError
from spark_cnn.imaging.preprocess import Preprocessing
from spark_cnn.models.spec import ModelSpec
from spark_cnn.spark.classify_job import embed as embed_job
from spark_cnn.task.launcher import find_sidecars
from tests.sample_images import broken_files, real_image_files, write_files
from tests.sidecar_doubles import RAW_GRID_FACTORY, TWO_HEADS_FACTORY, RawGrid

pytestmark = pytest.mark.spark

BROKEN = "/broken/"


def _local(path: str) -> str:
    return urlparse(path).path


@pytest.fixture(scope="module")
def mobilenet(mobilenet_weights) -> torch.nn.Module:
    model = torchvision.models.mobilenet_v3_small()
    model.load_state_dict(torch.load(mobilenet_weights, weights_only=True))
    return model.eval()


def _reference(model: torch.nn.Module, path: str, *, layer=None) -> np.ndarray:
    """Logits (or a layer's spatially averaged output) as plain torchvision computes them for one file."""
    prep = Preprocessing()
    pipeline = transforms.Compose([transforms.Resize(prep.resize), transforms.CenterCrop(prep.crop),
                                   transforms.ToTensor(), transforms.Normalize(prep.mean, prep.std)])
    with Image.open(path) as image, torch.inference_mode():
        x = pipeline(image.convert("RGB")).unsqueeze(0)
        return (model(x) if layer is None else layer(x).mean(dim=(2, 3)))[0].numpy()


def _binary_files(spark, folder):
    return spark.read.format("binaryFile").option("recursiveFileLookup", "true").load(folder).select("path", "content")


def _jobs_run(spark) -> int:
    return len(spark.sparkContext.statusTracker().getJobIdsForGroup())


@pytest.mark.spark35
def test_udf_outputs_equal_the_mapinarrow_path_and_torch(spark, mixed_folder, mobilenet_weights, mobilenet):
    images = _binary_files(spark, mixed_folder).repartition(3)  # several tasks, in two Python workers
    options = {"weights": mobilenet_weights, "top_k": 3}
    top1 = spark_cnn.cnn_udf("mobilenet_v3_small", output="top1", **options)
    topk = spark_cnn.cnn_udf("mobilenet_v3_small", output="topk", **options)
    logits = spark_cnn.cnn_udf("mobilenet_v3_small", output="logits", **options)
    vectors = spark_cnn.cnn_udf("mobilenet_v3_small", output="embedding", **options)
    raw = spark_cnn.cnn_udf(RAW_GRID_FACTORY, output="raw")  # not a classifier: (N, 2, 3, 3), served beside it
    by_udf = {_local(r["path"]): r for r in images.select(
        "path", top1("content").alias("top1"), topk("content").alias("topk"), logits("content").alias("logits"),
        vectors("content").alias("embedding"), raw("content").alias("raw")).collect()}
    by_job = {_local(r["path"]): r for r in spark_cnn.classify(
        images, model="mobilenet_v3_small", logits=True, embeddings=True, **options).collect()}
    raw_frame = spark_cnn.classify(images, model=RAW_GRID_FACTORY, output="raw")
    assert raw_frame.columns == ["path", "raw", "shape", "error"]
    by_raw_job = {_local(r["path"]): r for r in raw_frame.collect()}

    assert set(by_udf) == set(by_job) == {os.path.join(mixed_folder, p) for p in real_image_files()} | {
        os.path.join(mixed_folder, p) for p in broken_files() if not p.endswith("empty.png")}  # binaryFile skips 0 B
    for path, row in by_udf.items():
        job = by_job[path]
        errors = {row["top1"]["error"], row["topk"]["error"], row["logits"]["error"], row["embedding"]["error"]}
        if BROKEN in path:
            assert None not in errors and job["error"], path
            assert row["top1"]["label"] is None and row["topk"]["topk"] is None and row["logits"]["logits"] is None
            assert row["raw"]["error"] and row["raw"]["raw"] is None and by_raw_job[path]["raw"] is None
            continue
        assert errors == {None} and job["error"] is None, (path, errors)
        for raw_row in (row["raw"], by_raw_job[path]):  # the UDF and mapInArrow: the model's own output
            assert raw_row["error"] is None and raw_row["shape"] == [2, 3, 3], (path, raw_row["error"])
            np.testing.assert_allclose(np.reshape(raw_row["raw"], raw_row["shape"]), _reference(RawGrid(), path),
                                       rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(row["logits"]["logits"], _reference(mobilenet, path), rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(row["logits"]["logits"], job["logits"], rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(row["embedding"]["embedding"], job["embedding"], rtol=1e-5, atol=1e-5)
        assert (row["top1"]["label"], row["top1"]["score"]) == (job["label"], pytest.approx(job["score"]))
        # Scores may differ in the last bits: which images share a device batch changes float rounding.
        assert [p["label"] for p in row["topk"]["topk"]] == [p["label"] for p in job["topk"]]
        np.testing.assert_allclose([p["score"] for p in row["topk"]["topk"]], [p["score"] for p in job["topk"]],
                                   rtol=1e-5, atol=1e-7)
        assert row["top1"]["label_name"] is None and row["topk"]["topk"][0]["label_name"] is None  # no labels

    # One model per executor: local[2] has one executor, so one sidecar served every task of the UDF.
    assert len(top1.sidecars) == 1
    served = top1.sidecars[0]
    assert served["images"] == sum(BROKEN not in p for p in by_udf) and served["requests"] >= 3
    assert [s.pid for s in find_sidecars(spark.sparkContext.applicationId)] == [served["pid"]]


def test_image_struct_columns_give_the_same_outputs_as_bytes(spark, mixed_folder, mobilenet_weights):
    labels = [f"class {i}" for i in range(1000)]
    logits = spark_cnn.cnn_udf("mobilenet_v3_small", output="logits", weights=mobilenet_weights)
    named = spark_cnn.cnn_udf("mobilenet_v3_small", weights=mobilenet_weights, labels=labels)
    structs = spark.read.format("image").option("dropInvalid", False).option("recursiveFileLookup", "true") \
        .load(mixed_folder)
    by_struct = {_local(r["origin"]): r for r in structs.select(
        "image.origin", logits("image").alias("out"), named("image").alias("named")).collect()}
    by_bytes = {_local(r["path"]): r for r in _binary_files(spark, mixed_folder).select(
        "path", logits("content").alias("out")).collect()}
    frame = {_local(r["path"]): r for r in spark_cnn.classify(
        structs, model="mobilenet_v3_small", weights=mobilenet_weights, logits=True).collect()}

    assert set(by_struct) == set(frame) and set(by_struct) <= set(by_bytes)
    lossless = [p for p in by_struct if p.endswith(".png") and BROKEN not in p]
    assert len(lossless) >= 5  # RGBA, small RGB and grey digits
    for path in lossless:  # PNGs decode to the same pixels in Java and in Pillow
        struct_row = by_struct[path]
        assert struct_row["out"]["error"] is None, struct_row["out"]["error"]
        np.testing.assert_allclose(struct_row["out"]["logits"], by_bytes[path]["out"]["logits"], rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(frame[path]["logits"], struct_row["out"]["logits"], rtol=1e-5, atol=1e-5)
        assert struct_row["named"]["label_name"] == f"class {struct_row['named']['label']}"
    for path, row in by_struct.items():
        if path.endswith("notes.txt"):  # the image source's invalid rows (no pixels) are rows with an error
            assert row["out"]["error"] and row["out"]["logits"] is None and frame[path]["error"], path
        elif BROKEN not in path:  # (Java decodes what it can of a truncated JPEG: not an invalid row)
            assert row["out"]["error"] is None, (path, row["out"]["error"])


def test_bad_model_fails_when_the_udf_is_created_not_in_a_task(spark, demo_assets, mobilenet_weights):
    jobs_before = _jobs_run(spark)
    with pytest.raises(ModelError, match="unknown model"):
        spark_cnn.cnn_udf("resnet_does_not_exist")
    with pytest.raises(ModelError, match="do not fit"):
        spark_cnn.cnn_udf("spark_cnn.models.digits:digits_cnn", weights=mobilenet_weights)
    with pytest.raises(ConfigError, match="classes"):
        spark_cnn.cnn_udf("spark_cnn.models.digits:digits_cnn", weights=demo_assets.weights, labels=["a", "b"])
    with pytest.raises(ConfigError, match=r"is a segmenter.*use --output raw"):
        spark_cnn.cnn_udf(RAW_GRID_FACTORY)
    with pytest.raises(ModelError, match="returned a dict with keys out, aux"):
        spark_cnn.classify(_binary_files(spark, demo_assets.images), model=TWO_HEADS_FACTORY, output="raw")
    with pytest.raises(ModelError, match="--layer nope.*features"):
        spark_cnn.embed(_binary_files(spark, demo_assets.images), model="spark_cnn.models.digits:digits_cnn",
                        layer="nope")
    assert _jobs_run(spark) == jobs_before, "a Spark job ran before the model error"


def test_embed_job_with_layer_writes_path_embedding_error(spark, mixed_folder, mobilenet_weights, mobilenet,
                                                          tmp_path):
    output = str(tmp_path / "vectors")
    summary = embed_job(ClassifyConfig(mixed_folder, output, InferenceOptions(
        ModelSpec("mobilenet_v3_small", mobilenet_weights), embeddings=True, layer="features.12")), spark=spark)
    table = pq.read_table(output)
    assert table.column_names == ["path", "embedding", "error"]
    rows = {_local(r["path"]): r for r in table.to_pylist()}
    assert len(rows) == len(real_image_files()) + len(broken_files()) == summary["images"]
    assert summary["errors"] == len(broken_files())
    for path, row in rows.items():
        if BROKEN in path:
            assert row["error"] and row["embedding"] is None
            continue
        assert len(row["embedding"]) == 576  # features.12 of mobilenet_v3_small: 576 x 7 x 7, averaged
        np.testing.assert_allclose(row["embedding"], _reference(mobilenet, path, layer=mobilenet.features),
                                   rtol=1e-4, atol=1e-4)


def test_on_error_fail_fails_the_query_naming_the_error(spark, demo_assets, tmp_path):
    folder = write_files(str(tmp_path / "broken"), {k: v for k, v in broken_files().items() if "truncated" in k})
    strict = spark_cnn.cnn_udf("spark_cnn.models.digits:digits_cnn", weights=demo_assets.weights, on_error="fail")
    with pytest.raises(Exception, match=r"ImageError: image 0 of a batch of 1: cannot decode image"):
        _binary_files(spark, folder).select(strict("content")).collect()
