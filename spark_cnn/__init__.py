"""spark_cnn: run CNN models over image datasets on Spark, through one device sidecar per executor.

    >>> from spark_cnn import ClassifyConfig, ModelSpec, classify       # doctest: +SKIP
    >>> classify(ClassifyConfig("images/", "out.parquet", ModelSpec("resnet50")))  # doctest: +SKIP

Heavy modules (torch, pyspark) load on first use, so Spark tasks that import spark_cnn stay light.
"""

from __future__ import annotations

from spark_cnn.config import ClassifyConfig
from spark_cnn.errors import ConfigError, ImageError, InputError, ModelError, SidecarError, SparkCnnError
from spark_cnn.imaging.preprocess import Preprocessing
from spark_cnn.models.spec import ModelSpec

__all__ = ["ClassifyConfig", "ConfigError", "ImageError", "InputError", "ModelError", "ModelSpec", "Preprocessing",
           "SidecarError", "SparkCnnError", "classify", "spark_session"]
__version__ = "0.1.0"


def classify(config: ClassifyConfig, *, spark=None) -> dict:
    """Run the classify job (see `spark_cnn.spark.classify_job.classify`); returns the summary dict."""
    from spark_cnn.spark.classify_job import classify as run

    return run(config, spark=spark)


def spark_session(**options):
    """A SparkSession whose Python workers use this interpreter (see `spark_cnn.spark.session`)."""
    from spark_cnn.spark.session import spark_session as make

    return make(**options)
