"""A job's row counts, gathered while its output is written instead of by reading the output back.

Reading the written Parquet back to count it cost a second pass over every output file (a million rows in
thousands of files: a second job as long as listing them). `DataFrame.observe` computes the same aggregates
inside the write's own tasks; Spark adds them up from the successful attempt of each partition only (a retried
task counts once), and the driver reads them when the write has finished. Spark Connect clients before pyspark
4.0 have no Observation: there the output is read back as before (`read_back`).
"""

from __future__ import annotations

import importlib.util
import itertools
import json

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from spark_cnn.spark.session import is_connect
from spark_cnn.spark.sources import TRUE_LABEL, sql_string

_names = itertools.count()


def count_columns(columns: list[str], labels) -> list[Column]:
    """images, ok (no error) and, where rows carry `true_label`, labelled and correct (of the ok rows): class
    names when the model has `labels`, else class indices. Written as SQL, one py4j call per aggregate: built
    from `functions` they took ~190 calls, each costing the JVM CPU on every job (a short job's largest share)."""
    aggregates = ["count(1) AS images", "count_if(`error` IS NULL) AS ok"]
    if TRUE_LABEL in columns and "label" in columns:  # accuracy: classes only (not raw, boxes or masks)
        truth = f"`{TRUE_LABEL}`"
        if labels is not None:  # true labels are class names
            labelled, correct = _one_of(truth, labels), f"`label_name` = {truth}"
        else:  # true labels are class indices
            labelled, correct = f"{truth} RLIKE '^[0-9]+$'", f"CAST(`label` AS STRING) = {truth}"
        aggregates += [f"count_if(`error` IS NULL AND {labelled}) AS labelled",
                       f"count_if(`error` IS NULL AND {correct}) AS correct"]
    return [F.expr(aggregate) for aggregate in aggregates]


def _one_of(column: str, names) -> str:
    """SQL: `column` is one of `names`. The names cross to the JVM as one JSON literal, hex-encoded so that no
    class name needs SQL escaping (`isin` made a py4j call per name: 1,000 ImageNet classes cost ~4,000 calls)."""
    names_json = sql_string(json.dumps([str(name) for name in names]))
    return f"array_contains(from_json({names_json}, 'array<string>'), {column})"


class OutputCounts:
    """`observed(frame)` before the write; `totals()` after it: {images, ok[, labelled, correct]}."""

    def __init__(self, spark: SparkSession, labels=None):
        self.spark, self.labels = spark, labels
        self._observation = None
        self._columns: list[str] = []
        if is_connect(spark):
            if importlib.util.find_spec("pyspark.sql.connect.observation") is not None:
                from pyspark.sql.connect.observation import Observation

                self._observation = Observation(f"spark_cnn_counts_{next(_names)}")
        else:
            from pyspark.sql import Observation

            self._observation = Observation(f"spark_cnn_counts_{next(_names)}")

    @property
    def observing(self) -> bool:
        return self._observation is not None

    def observed(self, frame: DataFrame) -> DataFrame:
        """`frame`, counted as the next action runs (unchanged where this client cannot observe)."""
        self._columns = frame.columns
        if self._observation is None:
            return frame
        return frame.observe(self._observation, *count_columns(self._columns, self.labels))

    def totals(self, *, read_back: str | None = None) -> dict:
        """The counts of the finished write; without an observation, of the Parquet at `read_back`."""
        if self._observation is not None:
            return {k: int(v or 0) for k, v in self._observation.get.items()}
        if read_back is None:
            raise ValueError("this client cannot observe: give the written output to read back")
        rows = self.spark.read.parquet(read_back)
        return rows.agg(*count_columns(rows.columns, self.labels)).first().asDict()
