"""What differs on Spark Connect, without a server: which sessions count as Connect, the --remote checks made
before anything starts, and how a task without accumulators hands its sidecar counters to the driver."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest
from pyspark.sql.connect.session import SparkSession as ConnectSession

from spark_cnn.config import ClassifyConfig, InferenceOptions, check_remote
from spark_cnn.errors import ConfigError
from spark_cnn.models.spec import ModelSpec
from spark_cnn.spark.session import is_connect, owns_executors
from spark_cnn.task.stream import SIDECAR_STATS_COLUMN, SidecarCounters, stats_on_last_batch, with_stats_column

OPTIONS = InferenceOptions(ModelSpec("resnet18"))


def test_a_connect_session_is_connect_and_its_shared_server_outlives_the_job(monkeypatch):
    session = object.__new__(ConnectSession)  # the real class, never connected
    assert is_connect(session)
    monkeypatch.delenv("SPARK_LOCAL_REMOTE", raising=False)
    assert not owns_executors(session)  # sc://: its sidecars serve the server's other clients
    monkeypatch.setenv("SPARK_LOCAL_REMOTE", "1")  # pyspark started the server in this process
    assert owns_executors(session)


@pytest.mark.parametrize("master, remote, env, message", [
    (None, "spark://host:7077", None, "expected a Spark Connect URL, sc://HOST:PORT"),
    ("local[2]", "sc://host:15002", None, "--master local.2. and --remote sc://host:15002: .* give one"),
    ("local[2]", None, "sc://elsewhere:15002", "--master local.2. and SPARK_REMOTE=sc://elsewhere:15002"),
])
def test_remote_conflicts_stop_before_spark(monkeypatch, master, remote, env, message):
    monkeypatch.delenv("SPARK_REMOTE", raising=False)
    if env:
        monkeypatch.setenv("SPARK_REMOTE", env)
    with pytest.raises(ConfigError, match=message):
        ClassifyConfig("in/", "out/", OPTIONS, master=master, remote=remote)


def test_a_remote_alone_or_spark_remote_alone_is_fine(monkeypatch):
    monkeypatch.setenv("SPARK_REMOTE", "sc://elsewhere:15002")
    check_remote(None, None)
    check_remote(None, "local[2]")
    assert ClassifyConfig("in/", "out/", OPTIONS, remote="sc://h:1/;token=x").remote == "sc://h:1/;token=x"


def _batch(paths: list[str]) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict({"path": paths}, schema=pa.schema([("path", pa.string())]))


def test_the_partitions_sidecar_counters_ride_on_one_row_of_its_last_non_empty_batch():
    counters = SidecarCounters()

    def partition():  # as infer_batches: the counters arrive once the last batch is out of the sidecar
        yield _batch(["a", "b"])
        yield _batch(["c", "d", "e"])
        yield _batch([])
        counters.snapshot = {"host": "h", "pid": 1, "requests": 4}

    out = list(stats_on_last_batch(partition(), counters))
    assert [b.num_rows for b in out] == [2, 0, 3]  # rows unchanged; the last non-empty batch waited for the stats
    assert all(b.schema == with_stats_column(_batch([]).schema) for b in out)
    stats = [v for b in out for v in b.column(SIDECAR_STATS_COLUMN).to_pylist()]
    assert [json.loads(v) for v in stats if v is not None] == [{"host": "h", "pid": 1, "requests": 4}]
    assert out[2].column("path").to_pylist() == ["c", "d", "e"] and stats[2] is not None


def test_a_partition_without_rows_reports_nothing():
    assert list(stats_on_last_batch(iter([_batch([])]), SidecarCounters()))[0].num_rows == 0
    assert list(stats_on_last_batch(iter([]), SidecarCounters({"requests": 1}))) == []
