"""Spark Connect for real: one Connect server (local[2]) for the module, clients in their own processes (a
notebook, the jobs with --remote and SPARK_REMOTE); their rows equal the classic session's on the same images,
one sidecar serves the server's one executor, and nothing is left running when the server stops."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import spark_cnn
from tests.connect_server import REPO, ConnectServer
from tests.sidecar_harness import sidecar_pids

pytestmark = pytest.mark.spark

# A client imports pyspark and torch-free spark_cnn, checks the model in a child process and runs its queries.
CLIENT_TIMEOUT_S = 300
LOGITS_TOLERANCE = {"rtol": 1e-5, "atol": 1e-5}  # which images share a device batch changes the last bits


@pytest.fixture(scope="module")
def connect_server(tmp_path_factory):
    server = ConnectServer(str(tmp_path_factory.mktemp("connect")))
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def classic_rows(spark, mixed_folder, mobilenet_weights) -> dict[str, dict]:
    """classify(df) on the classic session over the same files, by path."""
    images = spark.read.format("binaryFile").option("recursiveFileLookup", "true").load(mixed_folder)
    frame = spark_cnn.classify(images.select("path", "content"), model="mobilenet_v3_small",
                               weights=mobilenet_weights, top_k=3, logits=True, embeddings=True)
    return {row["path"]: row.asDict(recursive=True) for row in frame.collect()}


def _client_env() -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")]))}
    for name in ("SPARK_REMOTE", "SPARK_CONNECT_MODE_ENABLED", "SPARK_LOCAL_REMOTE"):
        env.pop(name, None)
    return env


def _run(args: list[str], env: dict | None = None) -> subprocess.CompletedProcess:
    done = subprocess.run(args, cwd=REPO, env=env or _client_env(), capture_output=True, text=True,
                          timeout=CLIENT_TIMEOUT_S)
    assert done.returncode == 0, done.stderr[-4000:]
    return done


def _same_classification(row: dict, classic: dict) -> None:
    assert (row["error"] is None) == (classic["error"] is None), (row["path"], row["error"], classic["error"])
    if classic["error"] is not None:
        assert row["label"] is None and row["logits"] is None
        return
    assert row["label"] == classic["label"] and row["score"] == pytest.approx(classic["score"], rel=1e-5)
    assert [p["label"] for p in row["topk"]] == [p["label"] for p in classic["topk"]]
    np.testing.assert_allclose(row["logits"], classic["logits"], **LOGITS_TOLERANCE)


def test_notebook_api_on_connect_gives_the_classic_rows(connect_server, classic_rows, mixed_folder,
                                                        mobilenet_weights, tmp_path):
    result_path = str(tmp_path / "result.json")
    _run([sys.executable, "-m", "tests.integration.connect_client", connect_server.url, mixed_folder,
          mobilenet_weights, result_path])
    with open(result_path) as f:
        result = json.load(f)
    connect_server.app_id = result["app_id"]
    assert result["connect"] and not result["jvm"], "the client was not a pure Spark Connect client"

    by_path = {row["path"]: row for row in result["classify"]}
    assert set(by_path) == set(classic_rows) and len(by_path) >= 10
    assert sum(row["error"] is not None for row in by_path.values()) >= 2  # the broken files kept their rows
    for path, row in by_path.items():
        _same_classification(row, classic_rows[path])

    embedded = {row["path"]: row for row in result["embed"]}
    assert set(embedded) == set(classic_rows)
    for path, row in embedded.items():
        assert list(row) == ["path", "embedding", "error"]
        if classic_rows[path]["error"] is None:
            np.testing.assert_allclose(row["embedding"], classic_rows[path]["embedding"], **LOGITS_TOLERANCE)
        else:
            assert row["error"] and row["embedding"] is None

    udf = {row["path"]: row for row in result["udf"]}
    assert set(udf) == set(classic_rows)
    for path, row in udf.items():
        classic = classic_rows[path]
        assert (row["top1"]["error"] is None) == (classic["error"] is None) == (row["logits"]["error"] is None)
        if classic["error"] is None:
            assert row["top1"]["label"] == classic["label"]
            np.testing.assert_allclose(row["logits"]["logits"], classic["logits"], **LOGITS_TOLERANCE)
    assert "Spark Connect" in result["sidecars_error"]  # no accumulators there: said in one line
    groups = result["listed_groups"]
    assert len(groups) == 2  # one task per core of the server's local[2]
    assert result["listed"] == [[path, i] for i, group in enumerate(groups) for path in group]

    # One executor (local[2]): one sidecar served the three queries' tasks; it idles until the server stops.
    assert len(sidecar_pids(result["app_id"])) == 1


def test_jobs_on_connect_with_remote_and_spark_remote_write_the_classic_rows(connect_server, classic_rows,
                                                                             mixed_folder, mobilenet_weights,
                                                                             tmp_path):
    import pyarrow.parquet as pq

    model = ["--model", "mobilenet_v3_small", "--weights", mobilenet_weights, "--quiet"]
    spark_cnn_bin = os.path.join(os.path.dirname(sys.executable), "spark-cnn")
    classified, embedded = str(tmp_path / "classified"), str(tmp_path / "embedded")
    _run([spark_cnn_bin, "classify", mixed_folder, classified, "--remote", connect_server.url, "--top-k", "3",
          "--logits", *model])
    _run([spark_cnn_bin, "embed", mixed_folder, embedded, *model],
         env={**_client_env(), "SPARK_REMOTE": connect_server.url})  # as pyspark reads it

    rows = {row["path"]: row for row in pq.read_table(classified).to_pylist()}
    empty = {path for path in rows if path.endswith("empty.png")}  # the job keeps the 0-byte file binaryFile skips
    assert set(rows) - empty == set(classic_rows) and len(empty) == 1 and rows[empty.pop()]["error"]
    for path, classic in classic_rows.items():
        _same_classification(rows[path], classic)
    vectors = {row["path"]: row for row in pq.read_table(embedded).to_pylist()}
    assert set(vectors) == set(rows)
    for path, classic in classic_rows.items():
        if classic["error"] is None:
            np.testing.assert_allclose(vectors[path]["embedding"], classic["embedding"], **LOGITS_TOLERANCE)

    # The summary's sidecars come from DataFrame.observe (no accumulators on Connect): the server's one sidecar.
    with open(os.path.join(classified, "_summary.json")) as f:
        summary = json.load(f)
    assert summary["images"] == len(rows) and summary["errors"] == sum(r["error"] is not None for r in rows.values())
    (sidecar,) = summary["sidecars"]
    assert sidecar["images"] == summary["ok"] and sidecar["requests"] >= 1
    connect_server.app_id = summary["app_id"]
    assert sidecar_pids(summary["app_id"]) == [sidecar["pid"]]  # the job left it to its executor: shared server


def test_to_petastorm_on_connect_writes_the_dataset_the_classic_session_writes(connect_server, spark, mixed_folder,
                                                                              tmp_path):
    import pyarrow.parquet as pq

    from spark_cnn.config import PetastormConfig
    from spark_cnn.formats import petastorm
    from spark_cnn.spark.petastorm_job import to_petastorm

    spark_cnn_bin = os.path.join(os.path.dirname(sys.executable), "spark-cnn")
    on_connect, classic = str(tmp_path / "connect"), str(tmp_path / "classic")
    _run([spark_cnn_bin, "to-petastorm", mixed_folder, on_connect, "--remote", connect_server.url, "--quiet"])
    to_petastorm(PetastormConfig(mixed_folder, classic, quiet=True), spark=spark)

    def rows(dataset: str) -> dict:
        return {row["path"]: row for row in pq.read_table(dataset).to_pylist()}

    assert rows(on_connect) == rows(classic) and any(row["error"] for row in rows(classic).values())
    # Petastorm's metadata, written through pyarrow.fs on Connect: the schema and every file's row groups.
    metadata = pq.read_schema(os.path.join(on_connect, petastorm.COMMON_METADATA)).metadata
    files = {name for name in os.listdir(on_connect) if name.endswith(".parquet")}
    counts = json.loads(metadata[petastorm.ROW_GROUPS_PER_FILE_KEY])
    assert set(counts) == files and all(counts[name] == pq.ParquetFile(os.path.join(on_connect, name)).num_row_groups
                                        for name in files)
    def unischema(dataset: str):
        with open(os.path.join(dataset, petastorm.COMMON_METADATA), "rb") as f:
            return petastorm.read_unischema(f.read(), source=dataset)

    assert list(unischema(on_connect).fields) == list(unischema(classic).fields)
