"""The incremental ETL job on the shared local Spark: only new files, one row per file (zero-byte ones too), and
a batch that a killed run wrote but never committed is replayed in place instead of adding rows."""

from __future__ import annotations

import os
import shutil

import pyarrow.parquet as pq
import pytest

from spark_cnn.config import ClassifyConfig, EtlConfig, InferenceOptions
from spark_cnn.models.digits import DIGITS_FACTORY
from spark_cnn.models.spec import ModelSpec
from spark_cnn.spark.etl_job import STAGING, run_etl
from tests.sample_images import broken_files, write_files

pytestmark = pytest.mark.spark


def _copy_digits(demo_assets, root: str, classes: list[str], start: int, count: int) -> list[str]:
    copied = []
    for label in classes:
        names = sorted(os.listdir(os.path.join(demo_assets.images, label)))[start:start + count]
        os.makedirs(os.path.join(root, label), exist_ok=True)
        for name in names:
            copied.append(shutil.copy(os.path.join(demo_assets.images, label, name), os.path.join(root, label)))
    return copied


def _rows_by_path(output: str) -> dict[str, list[dict]]:
    by_path: dict[str, list[dict]] = {}
    for row in pq.read_table(output).to_pylist():
        by_path.setdefault(row["path"].removeprefix("file:"), []).append(row)
    return by_path


def test_etl_takes_new_files_once_and_a_replayed_batch_replaces_itself(spark, demo_assets, tmp_path):
    source, output, checkpoint = str(tmp_path / "in"), str(tmp_path / "out"), str(tmp_path / "checkpoint")
    inputs = _copy_digits(demo_assets, source, ["0", "1", "2"], 0, 4)
    write_files(source, broken_files())
    inputs += [os.path.join(source, rel) for rel in broken_files()]

    def run():
        model = InferenceOptions(ModelSpec(DIGITS_FACTORY, demo_assets.weights), labels=demo_assets.labels)
        config = EtlConfig(ClassifyConfig(source, output, model, quiet=True),
                           checkpoint=checkpoint, max_files_per_trigger=5)
        return run_etl(config, spark=spark)

    first = run()
    assert (first["images"], first["errors"]) == (15, 3)
    assert [b["batch"] for b in first["micro_batches"]] == [0, 1, 2]
    rows = _rows_by_path(output)
    assert sorted(rows) == sorted(inputs) and all(len(r) == 1 for r in rows.values())
    assert rows[os.path.join(source, "broken/empty.png")][0]["error"]  # a zero-byte file is a row with its error
    assert rows[os.path.join(source, "1", os.path.basename(inputs[5]))][0]["label_name"] == "1"

    inputs += _copy_digits(demo_assets, source, ["3"], 0, 4)
    inputs += [os.path.join(source, "late", "empty.jpg")]
    write_files(source, {"late/empty.jpg": b""})
    second = run()
    assert (second["images"], second["errors"]) == (5, 1)  # only what arrived since the first run
    assert [b["batch"] for b in second["micro_batches"]] == [3]

    # A run killed after writing batch 3 but before Spark committed it, or even logged its offsets: only the
    # source's log of its files is left, with a half-written attempt in staging. New files arrive meanwhile.
    for log in ("offsets", "commits"):
        os.remove(os.path.join(checkpoint, log, "3"))
        os.remove(os.path.join(checkpoint, log, ".3.crc"))
    write_files(os.path.join(output, STAGING, "batch=3"), {"part-stale.parquet": b"half written"})
    inputs += _copy_digits(demo_assets, source, ["4"], 0, 1)
    inputs += [os.path.join(source, "later", "empty.png")]
    write_files(source, {"later/empty.png": b""})
    replay = run()  # batch 3 now covers the source's entries 3 (the earlier attempt) and 4 (the new files)
    assert [b["batch"] for b in replay["micro_batches"]] == [3] and (replay["images"], replay["errors"]) == (7, 2)
    rows = _rows_by_path(output)
    assert sorted(rows) == sorted(inputs) and all(len(r) == 1 for r in rows.values())
    assert not os.listdir(os.path.join(output, STAGING))

    nothing_new = run()
    assert (nothing_new["images"], nothing_new["micro_batches"]) == (0, [])
    assert len(pq.read_table(output)) == 22
