"""A model that raises on real images, in a real local Spark job: the job fails with one line naming the cause,
never a table of error rows and success."""

from __future__ import annotations

import os

import pytest

from spark_cnn.config import ClassifyConfig, InferenceOptions
from spark_cnn.errors import SparkCnnError
from spark_cnn.models.spec import ModelSpec
from spark_cnn.spark.classify_job import classify
from tests.sample_images import digits_subset
from tests.sidecar_doubles import FAILING_FACTORY, FAILING_MESSAGE

pytestmark = pytest.mark.spark


def test_a_model_that_raises_fails_the_job_with_one_line_naming_the_cause(spark, demo_assets, tmp_path):
    images = digits_subset(demo_assets, str(tmp_path / "digits"), per_class=2)
    output = str(tmp_path / "out")

    with pytest.raises(SparkCnnError) as raised:  # the task's SidecarFault, re-raised on the driver
        classify(ClassifyConfig(images, output, InferenceOptions(ModelSpec(FAILING_FACTORY))), spark=spark)

    message = str(raised.value)
    print(f"\nmodel that raises, Spark {spark.sparkContext.master}: {message}")
    assert "\n" not in message
    assert message.startswith("model failure in the sidecar pid ")
    assert f"RuntimeError: {FAILING_MESSAGE}" in message
    assert not os.path.exists(output), "a failed job must leave no output"
