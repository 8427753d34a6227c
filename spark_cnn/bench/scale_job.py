"""One `bench-scale` measurement, in a process of its own (`python -m spark_cnn.bench.scale_job TASK OUT`): it is
the user's driver, so its memory and its JVM's are what the bench samples.

Modes: `classify` (the job as `spark-cnn classify` runs it, the near-free model), `etl` (one `spark-cnn etl`
run over the same files, new checkpoint), `plan` (what the driver does before the job: list the files, build
the input's partitions and run one Spark job over them, no inference). Every mode starts its session first
(timed apart: it does not grow with the files) with Spark's event log on, from which the parent reads when
each task ran. Writes {"mode", "session_s", "call_s", "call_started_ms", ...} as JSON to OUT.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import asdict, dataclass

MODES = ("classify", "etl", "plan")
# bench/variants.py's IDENTITY_FACTORY (32x32 inputs: the 8x8 digits are upscaled, not to 224), named here so the
# measured driver does not import torch as a user's driver does not.
IDENTITY_FACTORY = "spark_cnn.bench.tiny:identity_classifier"


@dataclass(frozen=True)
class ScaleTask:
    mode: str
    input: str
    output: str          # classify/etl: where the job writes; plan: unused
    event_log_dir: str
    files: int = 0       # how many files INPUT holds (for the report)
    master: str = "local[2]"
    model: str = IDENTITY_FACTORY

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode {self.mode!r}: expected one of {', '.join(MODES)}")


def _session(task: ScaleTask):
    from spark_cnn.spark.session import spark_session

    os.makedirs(task.event_log_dir, exist_ok=True)
    return spark_session(master=task.master, quiet=True, app_name=f"bench-scale-{task.mode}",
                         conf={"spark.eventLog.enabled": "true", "spark.eventLog.dir": "file:" + task.event_log_dir,
                               "spark.eventLog.compress": "false", "spark.eventLog.rolling.enabled": "false",
                               "spark.ui.enabled": "false"})


def _options(task: ScaleTask):
    from spark_cnn.config import InferenceOptions
    from spark_cnn.models.spec import ModelSpec

    return InferenceOptions(ModelSpec(task.model))


def run(task: ScaleTask) -> dict:
    from spark_cnn.task.launcher import stop_sidecars

    started = time.perf_counter()
    spark = _session(task)
    result: dict = {"mode": task.mode, "session_s": round(time.perf_counter() - started, 3),
                    "app_id": spark.sparkContext.applicationId}
    try:
        result["call_started_ms"] = int(time.time() * 1000)
        call = time.perf_counter()
        if task.mode == "classify":
            result["summary"] = _classify(task, spark)
        elif task.mode == "etl":
            result["summary"] = _etl(task, spark)
        else:
            result.update(_plan(task, spark))
        result["call_s"] = round(time.perf_counter() - call, 3)
        if task.mode == "classify":
            result["readback_s"] = _readback_s(spark, task.output)
    finally:
        spark.stop()  # first, so no task left over can start a sidecar after they are stopped (job_io)
        stop_sidecars(result["app_id"])
    return result


def _classify(task: ScaleTask, spark) -> dict:
    from spark_cnn.config import ClassifyConfig
    from spark_cnn.spark.classify_job import classify

    return classify(ClassifyConfig(task.input, task.output, inference=_options(task), quiet=True), spark=spark)


def _etl(task: ScaleTask, spark) -> dict:
    from spark_cnn.config import ClassifyConfig, EtlConfig
    from spark_cnn.spark.etl_job import run_etl

    config = EtlConfig(ClassifyConfig(task.input, task.output, inference=_options(task), quiet=True),
                       checkpoint=task.output.rstrip("/") + "-checkpoint", settle_s=0)
    return run_etl(config, spark=spark)


def _plan(task: ScaleTask, spark) -> dict:
    """List, build the input's partitions, run one job over them: what precedes the first inference task."""
    from spark_cnn.spark.sources import open_source
    from spark_cnn.spark.storage import to_uri

    listed = time.perf_counter()
    source = open_source(spark, to_uri(task.input))
    listing_s = time.perf_counter() - listed
    rows = source.frame.count()
    return {"listing_s": round(listing_s, 3), "rows": rows, "partitions": source.frame.rdd.getNumPartitions()}


def _readback_s(spark, output: str) -> float:
    """What the summary cost when it read the output back: one aggregate over the written Parquet."""
    from pyspark.sql import functions as F

    started = time.perf_counter()
    spark.read.parquet(output).agg(F.count(F.lit(1)), F.count_if(F.col("error").isNull())).first()
    return round(time.perf_counter() - started, 3)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    task = ScaleTask(**json.loads(argv[0]))
    result = run(task)
    result["task"] = asdict(task)
    with open(argv[1], "w") as f:
        json.dump(result, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
