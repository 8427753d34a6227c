"""spark_cnn: run CNN models over image datasets on Spark, through one device sidecar per executor.

    >>> import spark_cnn                                                          # doctest: +SKIP
    >>> spark = spark_cnn.spark_session(master="local[2]")                        # doctest: +SKIP
    >>> images = spark.read.format("binaryFile").load("photos/")                  # doctest: +SKIP
    >>> spark_cnn.classify(images, model="resnet50", weights="resnet50.pth").show()  # doctest: +SKIP
    >>> top1 = spark_cnn.cnn_udf("resnet50", weights="resnet50.pth")              # doctest: +SKIP
    >>> images.withColumn("pred", top1("content"))                                # doctest: +SKIP

Heavy modules (torch, pyspark) load on first use, so Spark tasks that import spark_cnn stay light.
"""

from __future__ import annotations

from spark_cnn.config import ClassifyConfig, InferenceOptions
from spark_cnn.errors import ConfigError, ImageError, InputError, ModelError, SidecarError, SparkCnnError
from spark_cnn.imaging.preprocess import Preprocessing
from spark_cnn.models.spec import ModelSpec

__all__ = ["ClassifyConfig", "ConfigError", "ImageError", "InferenceOptions", "InputError", "ModelError",
           "ModelSpec", "Preprocessing", "SidecarError", "SparkCnnError", "classify", "cnn_udf", "detect", "embed",
           "segment", "spark_session"]
__version__ = "0.1.0"


def classify(data, **options):
    """Classify images. Two forms:

    - `classify(df, model=..., ...)` -> a lazy DataFrame (`path, label, label_name, score, topk, error`), one
      row per row of `df` (see `spark_cnn.spark.frames.classify` for the options);
    - `classify(ClassifyConfig(...), spark=None)` -> runs the whole job (Parquet + summary) and returns the
      summary dict (see `spark_cnn.spark.classify_job.classify`).
    """
    if isinstance(data, ClassifyConfig):
        from spark_cnn.spark.classify_job import classify as run

        return run(data, **options)
    from spark_cnn.spark.frames import classify as classify_frame

    return classify_frame(data, **options)


def embed(data, **options):
    """Embed images: `embed(df, model=..., layer=None)` -> a lazy DataFrame of `path, embedding, error`
    (see `spark_cnn.spark.frames.embed`); `embed(ClassifyConfig(...))` runs the embed job and returns its
    summary (see `spark_cnn.spark.classify_job.embed`)."""
    if isinstance(data, ClassifyConfig):
        from spark_cnn.spark.classify_job import embed as run

        return run(data, **options)
    from spark_cnn.spark.frames import embed as embed_frame

    return embed_frame(data, **options)


def detect(data, **options):
    """Detect objects: `detect(df, model=..., min_score=..., max_detections=...)` -> a lazy DataFrame of
    `path, detections, error` (see `spark_cnn.spark.frames.detect`); `detect(ClassifyConfig(...))` runs the
    detect job and returns its summary (see `spark_cnn.spark.classify_job.detect`)."""
    if isinstance(data, ClassifyConfig):
        from spark_cnn.spark.classify_job import detect as run

        return run(data, **options)
    from spark_cnn.spark.frames import detect as detect_frame

    return detect_frame(data, **options)


def segment(data, **options):
    """Segment images: `segment(df, model=...)` -> a lazy DataFrame of `path, mask, classes, error` (see
    `spark_cnn.spark.frames.segment`); `segment(ClassifyConfig(...))` runs the segment job."""
    if isinstance(data, ClassifyConfig):
        from spark_cnn.spark.classify_job import segment as run

        return run(data, **options)
    from spark_cnn.spark.frames import segment as segment_frame

    return segment_frame(data, **options)


def cnn_udf(model="resnet50", **options):
    """A pandas UDF running a CNN on a column of image bytes or image structs (see `spark_cnn.spark.udf.cnn_udf`).

    >>> top1 = cnn_udf("resnet50", output="top1", weights="resnet50.pth")   # doctest: +SKIP
    >>> df.select("path", top1("content").alias("pred"))                    # doctest: +SKIP
    """
    from spark_cnn.spark.udf import cnn_udf as make

    return make(model, **options)


def spark_session(**options):
    """A SparkSession whose Python workers use this interpreter (see `spark_cnn.spark.session`)."""
    from spark_cnn.spark.session import spark_session as make

    return make(**options)
