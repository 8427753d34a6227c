"""DataFrame in, DataFrame out: `spark_cnn.classify(df, ...)` and `spark_cnn.embed(df, ...)`.

The fastest way in from code: the same `mapInArrow` task function as the classify job (PartitionInference),
so images stream to one sidecar per executor in Arrow batches. Nothing runs until an action (write, count,
collect); the model is checked on the driver when the function is called.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import BinaryType, StringType, StructType

from spark_cnn.config import InferenceOptions
from spark_cnn.errors import ConfigError
from spark_cnn.imaging.image_struct import is_image_struct
from spark_cnn.models.spec import ModelSpec
from spark_cnn.spark.executor import SPARK_TASK
from spark_cnn.spark.planning import check_model, start_inference
from spark_cnn.task.schema import CLASSES, EMBED_COLUMNS, layout_of, spark_ddl, task_output_schema
from spark_cnn.task.stream import INPUT_COLUMNS, PartitionInference


def inference_options(model: str | ModelSpec, *, weights: str | None = None,
                      preprocessing: Mapping[str, Any] | None = None, batch_size: int | str | None = "auto",
                      **options) -> InferenceOptions:
    """Keyword options as the notebook API takes them -> validated InferenceOptions.

    `model` is a name, file or `module:factory` (with `weights` and `preprocessing`), or a whole ModelSpec;
    `batch_size` is "auto" (or None) or a positive integer; other keywords are InferenceOptions fields.
    """
    if isinstance(model, ModelSpec):
        if weights is not None or preprocessing is not None:
            raise ConfigError("give weights and preprocessing inside the ModelSpec, or pass the model by name")
        spec = model
    else:
        spec = ModelSpec(model, weights=weights, preprocessing=preprocessing)
    unknown = sorted(set(options) - set(InferenceOptions.__dataclass_fields__) - {"model"})
    if unknown:
        raise ConfigError(f"unknown option(s) {', '.join(unknown)}; expected some of "
                          f"{', '.join(sorted(set(InferenceOptions.__dataclass_fields__) - {'model'}))}")
    if batch_size == "auto":
        batch_size = None
    if batch_size is not None and (isinstance(batch_size, bool) or not isinstance(batch_size, int)):
        raise ConfigError(f"batch_size {batch_size!r}: expected 'auto' or a positive integer")
    return InferenceOptions(model=spec, batch_size=batch_size, **options)


def classify(df: DataFrame, *, model: str | ModelSpec = "resnet50", content: str | None = None, path: str = "path",
             output: str = CLASSES, **options) -> DataFrame:
    """Classify the images of `df`; returns a lazy DataFrame with one row per input row.

    `content` names a column of image file bytes (as `spark.read.format("binaryFile")` gives) or of Spark
    `image` structs (as `spark.read.format("image")` gives); by default `content`, else the only image-struct
    column. `path` names a string column that names each row (for
    an image struct without one, its `origin`). Output columns are the classify job's: `path, label,
    label_name, score, topk, error` (+ `logits`, `embedding` when asked); with `output="raw"` (a model that is
    not a classifier: any one tensor, batch first) `path, raw, shape, error`: each image's output flattened in
    row-major order as array<float>, and its shape. A bad image is a row with `error`
    set (or a failed job with `on_error="fail"`). The other keywords are `inference_options`': `weights`,
    `preprocessing`, `batch_size` ("auto" or N), and any InferenceOptions field (labels, top_k, logits,
    embeddings, layer, device, precision, channels_last, compile, decode, threads, on_error, ...). The model is
    loaded once on the driver now, so a bad model, weights file or label file raises here (ModelError,
    ConfigError, InputError), before any Spark work.

    >>> import spark_cnn                                                          # doctest: +SKIP
    >>> spark = spark_cnn.spark_session(master="local[2]")                        # doctest: +SKIP
    >>> images = spark.read.format("binaryFile").load("photos/")                  # doctest: +SKIP
    >>> spark_cnn.classify(images, model="resnet50", weights="resnet50.pth").show()  # doctest: +SKIP
    """
    opts = inference_options(model, output_kind=output, **options)
    inputs = _image_rows(df, content, path)
    plan = start_inference(_session_of(df), opts, check_model(opts))
    ddl = spark_ddl(task_output_schema(opts.task, **layout_of(opts)))
    return inputs.mapInArrow(PartitionInference(plan, environment=SPARK_TASK), ddl)


def detect(df: DataFrame, *, model: str | ModelSpec = "fasterrcnn_mobilenet_v3_large_320_fpn", **options) -> DataFrame:
    """Detect objects in the images of `df`: a lazy DataFrame of `path, detections, error`, where `detections` is
    `array<struct<label int, label_name string, score float, box array<float>>>`, best first, each box
    (x1, y1, x2, y2) in the input image's pixels. `min_score` and `max_detections` limit the boxes; other
    keywords are `classify`'s (weights, labels, batch_size, device, ...). A classifier raises ConfigError here.

    >>> boxes = spark_cnn.detect(images, weights="DEFAULT", min_score=0.5)         # doctest: +SKIP
    """
    return classify(df, model=model, task="detect", **options)


def segment(df: DataFrame, *, model: str | ModelSpec = "lraspp_mobilenet_v3_large", **options) -> DataFrame:
    """Segment the images of `df`: a lazy DataFrame of `path, mask, classes, error`, where `mask` is a PNG of
    class indices at the input image's size and `classes` is `array<struct<label int, label_name string,
    pixels bigint>>`. Other keywords are `classify`'s (weights, labels, preprocessing, ...).

    >>> masks = spark_cnn.segment(images, model="deeplabv3_resnet50", weights="DEFAULT")  # doctest: +SKIP
    """
    return classify(df, model=model, task="segment", **options)


def embed(df: DataFrame, *, model: str | ModelSpec = "resnet50", **options) -> DataFrame:
    """Embed the images of `df`: a lazy DataFrame of `path, embedding (array<float>), error`.

    The embedding is the input of the model's last Linear layer (the penultimate features), or with `layer`
    the output of that named module (`model.named_modules()` names, e.g. "layer4"), averaged over its spatial
    positions. Other keywords are `classify`'s.

    >>> vectors = spark_cnn.embed(images, model="resnet50", layer="layer3")       # doctest: +SKIP
    >>> vectors.write.parquet("vectors.parquet")                                  # doctest: +SKIP
    """
    options.pop("embeddings", None)
    return classify(df, model=model, embeddings=True, **options).select(*EMBED_COLUMNS)


def _session_of(df: DataFrame) -> SparkSession:
    return df.sparkSession


def _image_rows(df: DataFrame, content: str | None, path: str) -> DataFrame:
    """`df` as the (path, content) rows PartitionInference reads; a clear error when the columns do not fit."""
    fields = {f.name: f.dataType for f in df.schema.fields}
    if content is None:
        structs = [name for name, kind in fields.items()
                   if isinstance(kind, StructType) and is_image_struct(kind.fieldNames())]
        content = INPUT_COLUMNS[1] if INPUT_COLUMNS[1] in fields or len(structs) != 1 else structs[0]
    if content not in fields:
        raise ConfigError(f"no column {content!r} in the DataFrame (columns: {', '.join(fields)}); pass "
                          f"content=<column of image bytes or image structs>")
    kind = fields[content]
    structs = isinstance(kind, StructType) and is_image_struct(kind.fieldNames())
    if not structs and not isinstance(kind, BinaryType):
        raise ConfigError(f"column {content!r} is {kind.simpleString()}; expected binary (image files) or a Spark "
                          f"image struct (origin, height, width, nChannels, mode, data)")
    if path in fields:
        if not isinstance(fields[path], StringType):
            raise ConfigError(f"column {path!r} is {fields[path].simpleString()}; the row names must be strings")
        names = F.col(path)
    elif structs:
        names = F.col(content).getField("origin")
    else:
        raise ConfigError(f"no column {path!r} in the DataFrame (columns: {', '.join(fields)}); pass path=<column "
                          f"of row names>, e.g. the file path")
    return df.select(names.alias(INPUT_COLUMNS[0]), F.col(content).alias(INPUT_COLUMNS[1]))
