"""`cnn_udf`: a CNN as a pandas UDF for `select` / `withColumn`, served by one sidecar per executor.

It is an iterator pandas UDF: each Python worker streams its Arrow batches through the same task-side code
as the mapInArrow job (`task.stream.infer_batches`), so all the tasks of an executor share one loaded model in
its sidecar (never one model per Python worker) and the sidecar's batching and tuning apply unchanged.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import Column, SparkSession
from pyspark.sql.functions import pandas_udf

from spark_cnn.errors import ConfigError, SparkCnnError
from spark_cnn.models.spec import ModelSpec
from spark_cnn.spark.accumulators import SidecarStatsParam
from spark_cnn.spark.executor import SPARK_TASK
from spark_cnn.spark.frames import inference_options
from spark_cnn.spark.planning import check_model, start_inference
from spark_cnn.spark.session import is_connect
from spark_cnn.task.schema import (
    CLASSES,
    NAMED_TOPK_ITEM,
    RAW,
    UDF_OUTPUT_TASKS,
    UDF_OUTPUTS,
    class_names,
    spark_type,
    udf_output_type,
)
from spark_cnn.task.stream import INPUT_COLUMNS, InferencePlan, SidecarCounters, infer_batches

# Each output is a struct, so that every row carries its `error` next to the values (null where fine).
OUTPUT_TYPES = {output: spark_type(udf_output_type(output)) for output in UDF_OUTPUTS}


class CnnUdf:
    """What `cnn_udf` returns: call it on a column to get a Column of the output struct.

    `sidecars` lists the sidecars that served this UDF so far (one entry per executor; counters as in the
    job summary), gathered from the tasks through an accumulator (a classic session's; Spark Connect has none).
    """

    def __init__(self, plan: InferencePlan, output: str, stats):
        self.plan = plan
        self.output = output
        self.return_type = OUTPUT_TYPES[output]
        self._stats = stats
        self._udf = pandas_udf(_udf_function(plan, output, stats), returnType=self.return_type)

    def __call__(self, column: str | Column) -> Column:
        return self._udf(column)

    @property
    def sidecars(self) -> list[dict]:
        if self._stats is None:
            raise SparkCnnError("cnn_udf(...).sidecars comes from a Spark accumulator, which a Spark Connect session "
                                "does not have; the classify and embed jobs report their sidecars on Connect too")
        return sorted(self._stats.value.values(), key=lambda s: (s["host"], str(s["executor"])))

    def __repr__(self) -> str:
        return f"cnn_udf({self.plan.endpoint.source!r}, output={self.output!r}) -> {self.return_type}"


def cnn_udf(model: str | ModelSpec = "resnet50", *, output: str = "top1", spark: SparkSession | None = None,
            **options) -> CnnUdf:
    """A pandas UDF running `model` on a column of image file bytes or Spark `image` structs.

    `output` picks the result, a struct per row with `error` (null when the image was fine):

    - "top1": `label int, label_name string, score float, error string`
    - "topk": `topk array<struct<label int, label_name string, score float>>` (best first), `error`
    - "logits": `logits array<float>`, `error`
    - "embedding": `embedding array<float>` (last Linear layer's input, or `layer`'s output averaged over
      space), `error`
    - "raw": `raw array<float>`, `shape array<int>`, `error`: the model's one output tensor (batch first) for
      each image, flattened in row-major order, and its per-image shape; for models that are not classifiers
    - "detections" (a detector): `detections array<struct<label int, label_name string, score float,
      box array<float>>>` in the input image's pixels, best first, `error` (`min_score`, `max_detections`)
    - "segments" (a segmenter): `mask binary` (PNG of class indices at the input's size), `classes
      array<struct<label int, label_name string, pixels bigint>>`, `error`

    `label_name` is null without `labels` (a file of class names, one per line, or a list of names). A bad
    image gives a row with `error` set, unless `on_error="fail"`. The model is loaded and checked on the
    driver now (ModelError / ConfigError here, not in a task); its files are shipped to the executors of
    `spark` (default: the active session). The other keywords are those of `spark_cnn.classify(df)`
    (weights, preprocessing, batch_size, labels, top_k, layer, device, precision, ...), but `output` says
    which heads run.

    >>> from spark_cnn import cnn_udf, spark_session                             # doctest: +SKIP
    >>> spark = spark_session(master="local[2]")                                 # doctest: +SKIP
    >>> images = spark.read.format("binaryFile").load("photos/")                 # doctest: +SKIP
    >>> classify = cnn_udf("resnet50", weights="resnet50.pth", labels="imagenet.txt")  # doctest: +SKIP
    >>> images.select("path", classify("content").alias("pred")).select("path", "pred.*").show()  # doctest: +SKIP
    """
    if output not in OUTPUT_TYPES:
        raise ConfigError(f"output={output!r}: expected one of {', '.join(OUTPUT_TYPES)}")
    heads = sorted({"logits", "embeddings", "output_kind"} & set(options))
    if heads:
        raise ConfigError(f"{', '.join(heads)}: cnn_udf runs the heads `output` asks for; use output='logits', "
                          "'embedding' or 'raw'")
    if options.get("layer") is not None and output != "embedding":
        raise ConfigError(f"layer={options['layer']!r} picks the embedding layer; use it with output='embedding'")
    spark = spark or SparkSession.getActiveSession()
    if spark is None:
        raise ConfigError("cnn_udf needs a SparkSession: create one first (spark_cnn.spark_session()) or pass spark=")
    task = UDF_OUTPUT_TASKS.get(output, "classify")
    dense = {"task": task} if task != "classify" else {}
    opts = inference_options(model, logits=output == "logits", embeddings=output == "embedding",
                             output_kind=RAW if output == RAW else CLASSES, **dense, **options)
    plan = start_inference(spark, opts, check_model(opts))
    stats = None if is_connect(spark) else spark.sparkContext.accumulator({}, SidecarStatsParam())
    return CnnUdf(plan, output, stats)


def _udf_function(plan: InferencePlan, output: str, stats):
    """The UDF body, closing over the plan (pickled to the tasks with it)."""

    def run(batches: Iterator[pd.Series]) -> Iterator[pd.DataFrame]:
        inputs = (_as_arrow(batch) for batch in batches)
        counters = SidecarCounters() if stats is not None else None
        for rows in infer_batches(plan, inputs, SPARK_TASK, counters=counters):
            yield output_frame(rows, output, plan.label_names)
        if counters is not None:
            counters.add_to(stats)

    return run


def _as_arrow(batch: pd.Series | pd.DataFrame) -> pa.RecordBatch:
    """A pandas UDF batch -> the (path: row names, content: images) batch infer_batches reads. Spark hands a
    struct column over as a DataFrame."""
    if isinstance(batch, pd.DataFrame):
        images = pa.Table.from_pandas(batch, preserve_index=False).to_struct_array().combine_chunks()
        names = [origin or f"image {i}" for i, origin in enumerate(batch["origin"])] if "origin" in batch else \
            [f"image {i}" for i in range(len(batch))]
    else:
        images = pa.array(batch.tolist(), pa.binary())
        names = [f"image {i} of a batch of {len(batch)}" for i in range(len(batch))]
    return pa.RecordBatch.from_arrays([pa.array(names, pa.string()), images], names=list(INPUT_COLUMNS))


def output_frame(rows: pa.RecordBatch, output: str, label_names: tuple[str, ...] | None) -> pd.DataFrame:
    """The classify output rows of one batch (stream.assemble) -> the UDF's struct fields."""
    columns = [_named_topk(rows.column(name), label_names) if name == "topk" else rows.column(name)
               for name in UDF_OUTPUTS[output]]
    frame = pa.RecordBatch.from_arrays(columns, schema=pa.schema(list(udf_output_type(output))))
    return frame.to_pandas(integer_object_nulls=True)


def _named_topk(topk: pa.ListArray, label_names: tuple[str, ...] | None) -> pa.ListArray:
    """The `topk` pairs with the class name of each label: list<struct<label, label_name, score>>."""
    pairs = topk.flatten()  # the pairs of this slice's rows; null rows have none
    labels = pairs.field("label")
    items = pa.StructArray.from_arrays([labels, class_names(labels, label_names), pairs.field("score")],
                                       fields=list(NAMED_TOPK_ITEM))
    # Offsets from the lengths: those of a slice start past zero, and the mask needs offsets of its own.
    lengths = pc.list_value_length(topk).fill_null(0).to_numpy(zero_copy_only=False)
    offsets = pa.array(np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32))
    return pa.ListArray.from_arrays(offsets, items, type=pa.list_(NAMED_TOPK_ITEM), mask=topk.is_null())
