"""The bench's row-at-a-time baseline (`row`) in the shared Spark session: one row per image, the top-1 of the
model called in-process. Its process shell (_run_spark_udf) is the one predict_batch_udf runs through in
`spark-cnn bench --quick` (tests/e2e/test_bench.py), so a Spark application of its own there would check nothing
more."""

from __future__ import annotations

import os

import numpy as np
import torch

from spark_cnn.bench.tiny import save_identity_torchscript
from spark_cnn.bench.variants import _open_rgb, _row_udf, _top1, load_model, user_transform
from tests.sample_images import real_image_files, write_files


def test_row_udf_classifies_every_image_once_as_the_model_does_in_process(spark, tmp_path):
    model = save_identity_torchscript(str(tmp_path / "identity.pt"))
    folder = write_files(str(tmp_path / "images"), real_image_files())  # photos and digits, several modes
    images = spark.read.format("binaryFile").option("recursiveFileLookup", "true").load(folder)
    rows = images.select("path", "content", _row_udf(model, None)("content").alias("p")).collect()
    assert len(rows) == len({r["path"] for r in rows}) == len(real_image_files())  # one row per image
    for r in rows:
        with torch.inference_mode():
            label, score = _top1(load_model(model, None)(user_transform()(_open_rgb(r["content"])).unsqueeze(0)))
        assert r["p"]["label"] == int(label[0]), os.path.basename(r["path"])
        assert np.isclose(r["p"]["score"], score[0], rtol=1e-5), os.path.basename(r["path"])
