"""A notebook on Spark Connect, as a user writes it: `python -m tests.integration.connect_client URL FOLDER WEIGHTS
RESULT.json`. Runs classify(df), embed(df) and cnn_udf over the image files under FOLDER on the server at URL
and writes what they returned (and what this process touched) to RESULT.json for the test to check."""

from __future__ import annotations

import json
import sys


def _rows(frame) -> list[dict]:
    return [row.asDict(recursive=True) for row in frame.collect()]


def main(url: str, folder: str, weights: str, result_path: str) -> None:
    from pyspark.sql import SparkSession

    import spark_cnn
    from spark_cnn.spark.session import application_id, is_connect

    spark = SparkSession.builder.remote(url).getOrCreate()
    images = (spark.read.format("binaryFile").option("recursiveFileLookup", "true").load(folder)
              .select("path", "content").repartition(3))  # several tasks
    options = {"weights": weights, "top_k": 3}
    classified = _rows(spark_cnn.classify(images, model="mobilenet_v3_small", logits=True, **options))
    embedded = _rows(spark_cnn.embed(images, model="mobilenet_v3_small", weights=weights))
    top1 = spark_cnn.cnn_udf("mobilenet_v3_small", output="top1", **options)
    logits = spark_cnn.cnn_udf("mobilenet_v3_small", output="logits", **options)
    by_udf = _rows(images.select("path", top1("content").alias("top1"), logits("content").alias("logits")))
    try:
        sidecars_error = f"listed {top1.sidecars}"
    except Exception as e:
        sidecars_error = f"{type(e).__name__}: {e}"

    # a small listing's layout on Connect: one partition per packed group, in order (the groups' own scan)
    from pyspark.sql.functions import spark_partition_id

    from spark_cnn.spark.listing import MIN_FILES_PER_TASK, Entry, pack_partitions
    from spark_cnn.spark.sources import file_packing, listed_frame

    entries = [Entry(f"/listed/{i:05d}.jpg", 1_000 + (i * 7919) % 300_000) for i in range(3_000)]
    groups = pack_partitions(entries, **file_packing(spark), min_files=MIN_FILES_PER_TASK)
    listed = listed_frame(spark, entries).select("path", spark_partition_id().alias("part"))

    from pyspark import SparkContext

    result = {"connect": is_connect(spark), "app_id": application_id(spark), "classify": classified,
              "embed": embedded, "udf": by_udf, "sidecars_error": sidecars_error,
              "listed": [[row.path, row.part] for row in listed.collect()],
              "listed_groups": [[e.path for e in group] for group in groups],
              # nothing above may have started a JVM or a SparkContext in this process
              "jvm": SparkContext._gateway is not None or SparkContext._active_spark_context is not None}
    spark.stop()
    with open(result_path, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main(*sys.argv[1:])
