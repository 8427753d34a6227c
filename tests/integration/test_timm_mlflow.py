"""timm and MLflow models through the classify job on a real local Spark: the driver resolves them once (timm's
data config; MLflow's registry and run artifacts in a sqlite store under a temporary folder) and ships one file;
the sidecar (one per executor) loads it and the outputs equal the model's own forward. The summary names the
weights. Tolerances as in tests/integration/test_tv_weights.py."""

from __future__ import annotations

from urllib.parse import urlparse

import numpy as np
import pyarrow.parquet as pq
import pytest
import timm
import torch
from PIL import Image

from spark_cnn.config import ClassifyConfig, InferenceOptions
from spark_cnn.errors import ModelError
from spark_cnn.imaging.preprocess import Preprocessing, preprocess_pixels
from spark_cnn.models.spec import ModelSpec, file_sha256
from spark_cnn.models.tensors import normalise
from spark_cnn.spark.classify_job import classify
from tests.mlflow_store import ALIAS, MODEL_NAME, SIZE, make_store
from tests.sample_images import real_image_files, write_files
from tests.timm_hub import TIMM_MODEL, save_timm_weights

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def photos(tmp_path_factory) -> str:
    files = {rel: data for rel, data in real_image_files().items() if rel.startswith(("photos/", "modes/"))}
    return write_files(str(tmp_path_factory.mktemp("photos")), files)


def _rows(output: str) -> list[dict]:
    return pq.read_table(output).to_pylist()


def _one_sidecar_per_executor(summary: dict) -> None:
    sidecars = summary["sidecars"]
    assert sidecars and len({s["executor"] for s in sidecars}) == len(sidecars) == len({s["pid"] for s in sidecars})
    assert sum(s["images"] for s in sidecars) == summary["images"]


def test_a_timm_model_classifies_as_timm_does_on_its_transforms(spark, photos, tmp_path):
    weights = save_timm_weights(str(tmp_path / "resnet10t.pth"))
    output = str(tmp_path / "out")
    summary = classify(ClassifyConfig(photos, output, InferenceOptions(ModelSpec(f"timm:{TIMM_MODEL}",
                                                                                 weights=weights),
                                                                       logits=True, top_k=3)), spark=spark)
    assert summary["weights"] == f"sha256:{file_sha256(weights)[:16]}" and summary["model"] == f"timm:{TIMM_MODEL}"
    reference = timm.create_model(TIMM_MODEL)
    reference.load_state_dict(torch.load(weights, weights_only=True))
    reference.eval()
    transform = timm.data.create_transform(**timm.data.resolve_model_data_config(reference))
    rows = _rows(output)
    assert len(rows) == summary["images"] > 0 and summary["errors"] == 0
    _one_sidecar_per_executor(summary)
    for row in rows:
        with Image.open(urlparse(row["path"]).path) as image, torch.inference_mode():
            expected = reference(transform(image.convert("RGB"))[None])[0].numpy()
        np.testing.assert_allclose(row["logits"], expected, rtol=0, atol=1e-4 * float(np.abs(expected).max()))
        assert [t["label"] for t in row["topk"]] == list(np.argsort(-expected)[:3])


def test_mlflow_registry_and_run_uris_classify_as_the_logged_model(spark, photos, tmp_path, monkeypatch):
    store = make_store(str(tmp_path / "mlflow"))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", store.tracking_uri)  # the driver's model check reads it
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    prep = Preprocessing(resize=36, crop=SIZE)
    expected = {}
    for run, (uri, version) in enumerate(((f"models:/{MODEL_NAME}/1", "1"), (f"models:/{MODEL_NAME}@{ALIAS}", "1"),
                                          (f"runs:/{store.run_id}/model", None))):
        output = str(tmp_path / f"out{run}")
        summary = classify(ClassifyConfig(photos, output, InferenceOptions(ModelSpec(uri, preprocessing=prep),
                                                                           logits=True)), spark=spark)
        assert summary["weights"].startswith(f"{uri} ({f'version {version}, ' if version else ''}sha256:")
        assert summary["errors"] == 0
        _one_sidecar_per_executor(summary)
        for row in _rows(output):
            if row["path"] not in expected:
                with open(urlparse(row["path"]).path, "rb") as f:
                    pixels = torch.from_numpy(preprocess_pixels(f.read(), prep).copy())[None]
                with torch.inference_mode():
                    expected[row["path"]] = store.model(normalise(pixels, prep))[0].numpy()
            np.testing.assert_allclose(row["logits"], expected[row["path"]], rtol=1e-5, atol=1e-6)
    assert expected
    jobs_before = len(spark.sparkContext.statusTracker().getJobIdsForGroup())
    with pytest.raises(ModelError, match=f"does not resolve at tracking URI {store.tracking_uri}: "):
        classify(ClassifyConfig(photos, str(tmp_path / "never"),
                                InferenceOptions(ModelSpec(f"models:/{MODEL_NAME}/9"))), spark=spark)
    assert len(spark.sparkContext.statusTracker().getJobIdsForGroup()) == jobs_before  # stopped before Spark
    assert not (tmp_path / "never").exists()
