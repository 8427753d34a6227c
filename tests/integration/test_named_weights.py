"""torchvision weights by name through the classify job on a real local Spark, offline: a private TORCH_HOME
seeded with random weights in torchvision's format. Label names come from the enum's categories, logits equal
torchvision's own model fed by the enum's transforms (on PIL images, Pillow's resize both ways: within 1e-4 of
the logits' largest magnitude), and the summary names the weights."""

from __future__ import annotations

import os
from urllib.parse import urlparse

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
import torchvision
from PIL import Image

from spark_cnn.config import ClassifyConfig, InferenceOptions
from spark_cnn.errors import ModelError
from spark_cnn.models.spec import ModelSpec
from spark_cnn.spark.classify_job import classify
from tests.sample_images import real_image_files, write_files
from tests.torch_home import seed_weights

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def photos(tmp_path_factory) -> str:
    files = {rel: data for rel, data in real_image_files().items() if rel.startswith(("photos/", "modes/"))}
    return write_files(str(tmp_path_factory.mktemp("photos")), files)


@pytest.fixture
def torch_home(tmp_path, monkeypatch) -> str:
    home = str(tmp_path / "torch_home")
    monkeypatch.setenv("TORCH_HOME", home)  # the driver's model check reads it; executors get the shipped file
    return home


@pytest.mark.parametrize("model, text", [("mobilenet_v3_small", "DEFAULT"),
                                         ("resnet50", "ResNet50_Weights.IMAGENET1K_V2")])
def test_named_weights_classify_like_torchvision_with_its_categories(spark, photos, torch_home, tmp_path, model,
                                                                     text):
    seed_weights(torch_home, model, text.rpartition(".")[2])
    output = str(tmp_path / "out")
    summary = classify(ClassifyConfig(photos, output, InferenceOptions(ModelSpec(model, weights=text), logits=True,
                                                                       top_k=3)), spark=spark)
    weights = torchvision.models.get_weight(text) if "." in text else torchvision.models.get_model_weights(model)[text]
    assert summary["weights"] == f"{type(weights).__name__}.{weights.name}"
    categories = weights.meta["categories"]
    reference = torchvision.models.get_model(model, weights=weights).eval()  # torchvision's loader, from TORCH_HOME
    rows = pq.read_table(output).to_pylist()
    assert len(rows) == summary["images"] > 0 and summary["errors"] == 0
    for row in rows:
        assert row["label_name"] == categories[row["label"]]
        with Image.open(urlparse(row["path"]).path) as image, torch.inference_mode():
            expected = reference(weights.transforms()(image.convert("RGB"))[None])[0].numpy()
        np.testing.assert_allclose(row["logits"], expected, rtol=0, atol=1e-4 * float(np.abs(expected).max()))


def test_without_the_file_or_network_the_job_stops_before_spark(spark, photos, torch_home, tmp_path, monkeypatch):
    for name in ("https_proxy", "HTTPS_PROXY"):  # nothing listens there: the download fails at once
        monkeypatch.setenv(name, "http://127.0.0.1:9")
    for name in ("no_proxy", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
    jobs_before = len(spark.sparkContext.statusTracker().getJobIdsForGroup())
    where = os.path.join(torch_home, "hub", "checkpoints", "mobilenet_v3_small-047dcff4.pth")
    with pytest.raises(ModelError, match=f"at {where}, or pass --weights FILE"):
        classify(ClassifyConfig(photos, str(tmp_path / "out"),
                                InferenceOptions(ModelSpec("mobilenet_v3_small", weights="DEFAULT"))), spark=spark)
    assert len(spark.sparkContext.statusTracker().getJobIdsForGroup()) == jobs_before
    assert not os.path.exists(tmp_path / "out")
