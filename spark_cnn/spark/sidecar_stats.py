"""How a job's tasks report the sidecars that served them, and how the driver reads them back.

A classic session has accumulators: each task adds its sidecar's snapshot to one. A Spark Connect session has
none, so there the tasks put the snapshot in a column of their output (`PartitionInference(stats_in_output=
True)`), `DataFrame.observe` gathers that column while the job's action runs, and the column is dropped before
anything is written. Either way the driver merges the snapshots with the same rule (`merge_snapshots`).
"""

from __future__ import annotations

import importlib.util
import itertools
import json

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from spark_cnn.spark.accumulators import SidecarStatsParam, merge_snapshots
from spark_cnn.spark.executor import SPARK_TASK
from spark_cnn.spark.session import is_connect
from spark_cnn.task.client import sidecar_key
from spark_cnn.task.schema import spark_ddl
from spark_cnn.task.stream import SIDECAR_STATS_COLUMN, InferencePlan, PartitionInference, with_stats_column


class JobSidecarStats:
    """The sidecars of one job: `task_function` for its mapInArrow, `observed` on that mapInArrow's output
    (before any select or write), `sidecars()` after the actions have run."""

    def __init__(self, spark: SparkSession, job_id: str):
        connect = is_connect(spark)
        # Spark Connect clients before pyspark 4.0 have no Observation: their jobs list no sidecars.
        self.in_output = connect and importlib.util.find_spec("pyspark.sql.connect.observation") is not None
        self._accumulator = None if connect else spark.sparkContext.accumulator({}, SidecarStatsParam())
        self._job_id = job_id
        self._observations = []
        self._names = itertools.count()

    def task_function(self, plan: InferencePlan) -> PartitionInference:
        return PartitionInference(plan, self._accumulator, SPARK_TASK, stats_in_output=self.in_output)

    def ddl(self, schema: pa.Schema) -> str:
        """The task function's output type for output rows of `schema`."""
        return spark_ddl(with_stats_column(schema) if self.in_output else schema)

    def observed(self, outputs: DataFrame) -> DataFrame:
        """The task function's output without the stats column, which is gathered as the next action runs."""
        if not self.in_output:
            return outputs
        from pyspark.sql.connect.observation import Observation

        observation = Observation(f"spark_cnn_sidecars_{self._job_id}_{next(self._names)}")
        self._observations.append(observation)
        # collect_list: one value per partition that ran (the others are null and skipped)
        gathered = outputs.observe(observation, F.collect_list(SIDECAR_STATS_COLUMN).alias(SIDECAR_STATS_COLUMN))
        return gathered.drop(SIDECAR_STATS_COLUMN)

    def sidecars(self) -> list[dict]:
        """One entry per sidecar that served the job's finished actions, its latest counters."""
        if self._accumulator is not None:
            merged = dict(self._accumulator.value)
        else:
            merged = {}
            for observation in self._observations:
                for text in observation.get.get(SIDECAR_STATS_COLUMN) or ():
                    snapshot = json.loads(text)
                    merge_snapshots(merged, {sidecar_key(snapshot): snapshot})
        return sorted(merged.values(), key=lambda s: (s["host"], str(s["executor"])))
