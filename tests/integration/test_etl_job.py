"""The incremental ETL job on the shared local Spark: only new files, one row per file (zero-byte ones too), a
batch that a killed run wrote but never committed is replayed in place instead of adding rows, files of any
modification time land once they have settled, and a file that cannot be read is a row with its error."""

from __future__ import annotations

import json
import os
import shutil
import time
from datetime import datetime, timezone

import numpy as np
import pyarrow.parquet as pq
import pytest
from PIL import Image

from spark_cnn.config import ClassifyConfig, EtlConfig, InferenceOptions, InputOptions
from spark_cnn.errors import ConfigError
from spark_cnn.models.digits import DIGITS_FACTORY
from spark_cnn.models.spec import ModelSpec
from spark_cnn.spark import etl_log
from spark_cnn.spark.etl_isolate import MAX_BATCH_ATTEMPTS
from spark_cnn.spark.etl_job import STAGING, MicroBatchWriter, run_etl
from tests.etl_doubles import FAILS_ON_RED_FACTORY, FAILS_ON_RED_MESSAGE
from tests.sample_images import broken_files, write_files

pytestmark = pytest.mark.spark

SETTLE_S = 3.0  # the settle time of the test that writes a file during a run
BINARY_FILE_SCHEMA = "path string, modificationTime timestamp, length bigint, content binary"
HUGE_FILE_BYTES = 3 << 30  # over Spark's binaryFile limit (2 GiB - 1): the JVM could never read it


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


@pytest.mark.spark35
def test_etl_takes_new_files_once_and_a_replayed_batch_replaces_itself(spark, demo_assets, tmp_path):
    source, output, checkpoint = str(tmp_path / "in"), str(tmp_path / "out"), str(tmp_path / "checkpoint")
    inputs = _copy_digits(demo_assets, source, ["0", "1", "2"], 0, 4)
    write_files(source, broken_files())
    inputs += [os.path.join(source, rel) for rel in broken_files()]

    def run():
        model = InferenceOptions(ModelSpec(DIGITS_FACTORY, demo_assets.weights), labels=demo_assets.labels)
        config = EtlConfig(ClassifyConfig(source, output, model, quiet=True),
                           checkpoint=checkpoint, max_files_per_trigger=5, settle_s=0)
        return run_etl(config, spark=spark)

    first = run()
    assert (first["images"], first["errors"]) == (15, 3)
    assert [b["batch"] for b in first["micro_batches"]] == [0, 1, 2]
    assert first["weights"].startswith("sha256:")  # the summary names the weights the sidecars ran
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

    # A run killed after writing batch 3 but before the checkpoint marked it done, with a half-written attempt
    # in staging; and one killed as it began writing the file list of batch 4 (still empty). New files arrive.
    os.remove(os.path.join(checkpoint, "done", "3"))
    os.remove(os.path.join(checkpoint, "done", ".3.crc"))
    write_files(os.path.join(checkpoint, "batches"), {"4": b""})
    write_files(os.path.join(output, STAGING, "batch=3"), {"part-stale.parquet": b"half written"})
    inputs += _copy_digits(demo_assets, source, ["4"], 0, 1)
    inputs += [os.path.join(source, "later", "empty.png")]
    write_files(source, {"later/empty.png": b""})
    replay = run()  # batch 3 again with its own files, then batch 4 with the new ones
    assert [b["batch"] for b in replay["micro_batches"]] == [3, 4] and (replay["images"], replay["errors"]) == (7, 2)
    rows = _rows_by_path(output)
    assert sorted(rows) == sorted(inputs) and all(len(r) == 1 for r in rows.values())
    assert not os.listdir(os.path.join(output, STAGING))

    nothing_new = run()
    assert (nothing_new["images"], nothing_new["micro_batches"]) == (0, [])
    assert len(pq.read_table(output)) == 22


# ---- every file that appears lands exactly once, whatever its modification time --------------------------------

def _etl(spark, demo_assets, source, output, checkpoint, **options):
    model = InferenceOptions(ModelSpec(DIGITS_FACTORY, demo_assets.weights), labels=demo_assets.labels,
                             **options.pop("inference", {}))
    inputs = InputOptions(glob=options.pop("glob")) if "glob" in options else InputOptions()
    config = EtlConfig(ClassifyConfig(source, output, model, quiet=True, inputs=inputs), checkpoint=checkpoint,
                       **{"settle_s": 0, "max_files_per_trigger": 5, **options})
    return run_etl(config, spark=spark)


def _set_mtime(paths: list[str], seconds: float) -> None:
    for path in paths:
        os.utime(path, (seconds, seconds))


def test_files_with_old_modification_times_land_exactly_once(spark, demo_assets, tmp_path):
    source, output, checkpoint = str(tmp_path / "in"), str(tmp_path / "out"), str(tmp_path / "checkpoint")
    inputs = _copy_digits(demo_assets, source, ["0", "1"], 0, 3)
    first = _etl(spark, demo_assets, source, output, checkpoint)
    assert first["images"] == 6

    # As `cp -p`, `rsync -a` or `tar x` leave them: years older than what was already processed.
    old = _copy_digits(demo_assets, source, ["2"], 0, 3) + _copy_digits(demo_assets, source, ["3"], 0, 2)
    _set_mtime(old[:3], datetime(2001, 1, 1, tzinfo=timezone.utc).timestamp())
    _set_mtime(old[3:], 0)  # the epoch itself
    inputs += old
    second = _etl(spark, demo_assets, source, output, checkpoint)
    assert (second["images"], second["errors"]) == (5, 0)
    rows = _rows_by_path(output)
    assert sorted(rows) == sorted(inputs) and all(len(r) == 1 for r in rows.values())
    assert {rows[p][0]["label_name"] for p in old[:3]} == {"2"}
    assert _etl(spark, demo_assets, source, output, checkpoint)["images"] == 0


def test_a_file_still_being_written_is_taken_once_complete(spark, demo_assets, tmp_path):
    source, output, checkpoint = str(tmp_path / "in"), str(tmp_path / "out"), str(tmp_path / "checkpoint")
    settled_files = _copy_digits(demo_assets, source, ["4"], 0, 2)
    _set_mtime(settled_files, time.time() - 3600)
    digit = _copy_digits(demo_assets, str(tmp_path / "elsewhere"), ["5"], 0, 1)[0]
    with open(digit, "rb") as f:
        whole = f.read()
    growing = os.path.join(source, "5", "growing.png")
    os.makedirs(os.path.dirname(growing))
    with open(growing, "wb") as f:
        f.write(whole[: len(whole) // 2])  # a copy in progress when the run lists INPUT
    future = _copy_digits(demo_assets, source, ["6"], 0, 1)[0]
    _set_mtime([future], time.time() + 86400)  # from an archive made on a clock a day ahead

    first = _etl(spark, demo_assets, source, output, checkpoint, settle_s=SETTLE_S)
    assert (first["images"], first["errors"], first["waiting"]) == (2, 0, 2)
    with open(growing, "ab") as f:
        f.write(whole[len(whole) // 2:])
    time.sleep(SETTLE_S + 0.5)
    second = _etl(spark, demo_assets, source, output, checkpoint, settle_s=SETTLE_S)
    assert (second["images"], second["errors"], second["waiting"]) == (2, 0, 0)
    rows = _rows_by_path(output)
    assert sorted(rows) == sorted([*settled_files, growing, future]) and all(len(r) == 1 for r in rows.values())
    assert rows[growing][0]["error"] is None and rows[growing][0]["label_name"] == "5"


# ---- a file that cannot be read is a row with its error, and later micro-batches go on ----------------------------

def test_unreadable_vanished_and_huge_files_are_error_rows_and_later_batches_continue(spark, demo_assets, tmp_path,
                                                                                      monkeypatch):
    source, output, checkpoint = str(tmp_path / "in"), str(tmp_path / "out"), str(tmp_path / "checkpoint")
    good = _copy_digits(demo_assets, source, ["7"], 0, 4)
    bad = os.path.join(source, "bad")
    os.makedirs(bad)
    os.symlink("loop.png", os.path.join(bad, "loop.png"))  # unreadable even by root: ELOOP
    os.symlink(os.path.join(bad, "nowhere.png"), os.path.join(bad, "dangling.png"))
    with open(os.path.join(bad, "huge.png"), "wb") as f:
        f.truncate(HUGE_FILE_BYTES)  # sparse: no disk, but more than any JVM byte array holds
    vanishing = _copy_digits(demo_assets, bad, ["8"], 0, 1)[0]

    write = MicroBatchWriter.write

    def delete_then_write(self, batch_id, files):  # the file goes between the listing and its batch's read
        if os.path.exists(vanishing):
            os.remove(vanishing)
        return write(self, batch_id, files)

    monkeypatch.setattr(MicroBatchWriter, "write", delete_then_write)
    first = _etl(spark, demo_assets, source, output, checkpoint, max_files_per_trigger=2)
    monkeypatch.undo()
    assert (first["images"], first["errors"], len(first["micro_batches"])) == (8, 4, 4)
    rows = _rows_by_path(output)
    expected_bad = [os.path.join(bad, n) for n in ("loop.png", "dangling.png", "huge.png")] + [vanishing]
    assert sorted(rows) == sorted(good + expected_bad) and all(len(r) == 1 for r in rows.values())
    assert all(rows[p][0]["error"] is None for p in good)
    assert "file too large" in rows[os.path.join(bad, "huge.png")][0]["error"]
    assert all("cannot read file" in rows[p][0]["error"] for p in expected_bad if not p.endswith("huge.png"))

    more = _copy_digits(demo_assets, source, ["9"], 0, 1)
    second = _etl(spark, demo_assets, source, output, checkpoint, max_files_per_trigger=2)
    assert (second["images"], second["errors"]) == (1, 0)
    assert sorted(_rows_by_path(output)) == sorted(good + expected_bad + more)


# ---- the reading options in a real incremental run (item 6: honoured, or refused by EtlConfig) ----------------

def test_glob_max_file_bytes_and_max_pixels_hold_in_an_incremental_run(spark, demo_assets, tmp_path):
    source, output, checkpoint = str(tmp_path / "in"), str(tmp_path / "out"), str(tmp_path / "checkpoint")
    digits = _copy_digits(demo_assets, source, ["1"], 0, 2)
    width, height = Image.open(digits[0]).size
    big = np.random.default_rng(0).integers(0, 255, (4 * height, 4 * width), dtype=np.uint8)
    Image.fromarray(big).save(os.path.join(source, "1", "big.png"))  # more pixels, still under the byte limit
    max_file_bytes = os.path.getsize(os.path.join(source, "1", "big.png")) + 1
    write_files(source, {"1/heavy.png": b"\x89PNG" + bytes(max_file_bytes), "1/skipped.jpg": b"not taken"})
    options = {"glob": "*.png", "inference": {"max_pixels": 4 * width * height, "max_file_bytes": max_file_bytes}}
    first = _etl(spark, demo_assets, source, output, checkpoint, **options)
    assert (first["images"], first["errors"]) == (4, 2)
    rows = _rows_by_path(output)
    assert sorted(rows) == sorted([*digits, os.path.join(source, "1", "big.png"), os.path.join(source, "1/heavy.png")])
    assert "--max-pixels" in rows[os.path.join(source, "1", "big.png")][0]["error"]
    assert "--max-file-bytes" in rows[os.path.join(source, "1/heavy.png")][0]["error"]
    write_files(source, {"2/late.jpg": b"not taken either"})
    assert _etl(spark, demo_assets, source, output, checkpoint, **options)["images"] == 0
    for refused in ({"input_format": "parquet"}, {"partition_by": "label"}):
        with pytest.raises(ConfigError):
            EtlConfig(ClassifyConfig(source, output, InferenceOptions(ModelSpec(DIGITS_FACTORY)),
                                     **({"inputs": InputOptions(format="parquet")} if "input_format" in refused
                                        else refused)), checkpoint=checkpoint)


# ---- the checkpoint: compaction, and the Structured Streaming checkpoint of earlier versions ----------------------

def test_compacted_checkpoint_still_takes_each_file_once(spark, demo_assets, tmp_path, monkeypatch):
    source, output, checkpoint = str(tmp_path / "in"), str(tmp_path / "out"), str(tmp_path / "checkpoint")
    monkeypatch.setattr(etl_log, "COMPACT_EVERY", 2)
    inputs = _copy_digits(demo_assets, source, ["0"], 0, 4)
    assert len(_etl(spark, demo_assets, source, output, checkpoint, max_files_per_trigger=1)["micro_batches"]) == 4
    inputs += _copy_digits(demo_assets, source, ["1"], 0, 1)
    second = _etl(spark, demo_assets, source, output, checkpoint)  # the first run folded batches 0-3 at its end
    assert [b["batch"] for b in second["micro_batches"]] == [4]
    assert sorted(n for n in os.listdir(os.path.join(checkpoint, "batches")) if not n.startswith(".")) == [
        "3.compact", "4"]
    assert _etl(spark, demo_assets, source, output, checkpoint)["images"] == 0
    rows = _rows_by_path(output)
    assert sorted(rows) == sorted(inputs) and all(len(r) == 1 for r in rows.values())


def test_a_structured_streaming_checkpoint_of_an_earlier_version_is_carried_on(spark, demo_assets, tmp_path):
    source, output, checkpoint = str(tmp_path / "in"), str(tmp_path / "out"), str(tmp_path / "checkpoint")
    earlier = _copy_digits(demo_assets, source, ["2"], 0, 5)
    # What the earlier ETL left: Spark's file stream source log and a query checkpoint (2 files per batch), its
    # last batch logged but never committed (the run was killed).
    query = (spark.readStream.format("binaryFile").schema(BINARY_FILE_SCHEMA).option("recursiveFileLookup", "true")
             .option("maxFilesPerTrigger", 2).load("file://" + source).writeStream
             .foreachBatch(lambda frame, batch_id: None).option("checkpointLocation", "file://" + checkpoint)
             .trigger(availableNow=True).start())
    query.awaitTermination()
    os.remove(os.path.join(checkpoint, "commits", "2"))
    os.remove(os.path.join(checkpoint, "commits", ".2.crc"))
    entries = open(os.path.join(checkpoint, "sources", "0", "2")).read().splitlines()[1:]
    replayed = [os.path.join(source, "2", json.loads(line)["path"].rsplit("/", 1)[1]) for line in entries]
    assert len(replayed) == 1 and replayed[0] in earlier

    new = _copy_digits(demo_assets, source, ["3"], 0, 2)
    run = _etl(spark, demo_assets, source, output, checkpoint)
    assert [b["batch"] for b in run["micro_batches"]] == [2, 3]  # the uncommitted batch, then the new files
    rows = _rows_by_path(output)
    assert sorted(rows) == sorted(replayed + new) and all(len(r) == 1 for r in rows.values())
    assert _etl(spark, demo_assets, source, output, checkpoint)["images"] == 0


# ---- a micro-batch the model always fails on: isolated after MAX_BATCH_ATTEMPTS, and new files go on -----------

def test_a_batch_the_model_always_fails_is_bisected_into_an_error_row_and_new_files_go_on(spark, demo_assets,
                                                                                         tmp_path):
    source, output, checkpoint = str(tmp_path / "in"), str(tmp_path / "out"), str(tmp_path / "checkpoint")
    good = _copy_digits(demo_assets, source, ["5"], 0, 3)
    red = os.path.join(source, "5", "red.png")
    Image.fromarray(np.full((32, 32, 3), (255, 0, 0), np.uint8)).save(red)
    def run():
        options = InferenceOptions(ModelSpec(FAILS_ON_RED_FACTORY, demo_assets.weights), labels=demo_assets.labels)
        config = EtlConfig(ClassifyConfig(source, output, options, quiet=True), checkpoint=checkpoint,
                           max_files_per_trigger=8, settle_s=0)
        return run_etl(config, spark=spark)

    for _ in range(MAX_BATCH_ATTEMPTS - 1):  # the batch fails the run, and the next run replays it first
        with pytest.raises(Exception, match=FAILS_ON_RED_MESSAGE):
            run()
    more = _copy_digits(demo_assets, source, ["6"], 0, 2)
    summary = run()
    assert summary["isolated"] == ["file:" + red] and summary["errors"] == 1
    assert [b["batch"] for b in summary["micro_batches"]] == [0, 1]  # the replayed batch, then the new files
    rows = _rows_by_path(output)
    assert sorted(rows) == sorted(good + [red] + more) and all(len(r) == 1 for r in rows.values())
    assert rows[red][0]["error"].startswith(f"isolated: its micro-batch failed {MAX_BATCH_ATTEMPTS} times")
    assert FAILS_ON_RED_MESSAGE in rows[red][0]["error"]
    assert all(rows[p][0]["error"] is None for p in good + more)
    assert not os.listdir(os.path.join(output, STAGING))
    assert run()["images"] == 0
