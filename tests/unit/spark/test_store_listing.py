"""Listing an object store (over pyarrow's in-memory filesystem) and ArrowFS on local paths."""

from __future__ import annotations

import os
from datetime import datetime, timezone

import pytest
from pyarrow.fs import _MockFileSystem

from spark_cnn.errors import InputError
from spark_cnn.spark.listing import list_store, pack_partitions
from spark_cnn.spark.sources import byte_size
from spark_cnn.spark.storage import ArrowFS, missing_filesystem_error


@pytest.fixture()
def bucket():
    fs = _MockFileSystem(datetime(2026, 1, 1, tzinfo=timezone.utc))
    for key, data in {"imgs/in/cat/a.jpg": b"a" * 10, "imgs/in/cat/b.png": b"b" * 30, "imgs/in/dog/deep/c.jpg": b"c",
                      "imgs/in/empty.jpg": b"", "imgs/in/_SUCCESS": b"", "imgs/in/.hidden/d.jpg": b"d",
                      "imgs/in/_tmp/e.jpg": b"e", "imgs/in/k=v/f.jpg": b"f", "imgs/in/g.jpg._COPYING_": b"g",
                      "imgs/other/x.jpg": b"x"}.items():
        fs.create_dir(os.path.dirname(key))
        with fs.open_output_stream(key) as f:
            f.write(data)
    return fs


def _uri(path: str) -> str:
    return "s3://" + path


def test_a_store_listing_keeps_visible_objects_zero_bytes_included(bucket):
    entries = list_store(bucket, "imgs/in", uri_of=_uri)
    assert [(e.path, e.size) for e in entries] == [
        ("s3://imgs/in/cat/a.jpg", 10), ("s3://imgs/in/cat/b.png", 30), ("s3://imgs/in/dog/deep/c.jpg", 1),
        ("s3://imgs/in/empty.jpg", 0), ("s3://imgs/in/k=v/f.jpg", 1)]  # hidden names skipped as Spark skips them
    assert all(e.error is None and e.mtime_ms == 1767225600000 for e in entries)
    assert [e.path for e in list_store(bucket, "imgs/in/", glob="*.{png,jpg}", uri_of=_uri)][:2] == \
        ["s3://imgs/in/cat/a.jpg", "s3://imgs/in/cat/b.png"]
    assert [e.path for e in list_store(bucket, "imgs/in", glob="*.png")] == ["imgs/in/cat/b.png"]


def test_a_store_listing_of_one_object_or_of_nothing(bucket):
    assert [e.size for e in list_store(bucket, "imgs/in/cat/b.png")] == [30]
    assert list_store(bucket, "imgs/in/cat/b.png", glob="*.jpg") == []
    with pytest.raises(FileNotFoundError):
        list_store(bucket, "imgs/missing")


def test_listed_objects_pack_as_spark_packs_files(bucket):
    entries = list_store(bucket, "imgs/in")
    groups = pack_partitions(entries, max_partition_bytes=32, open_cost_bytes=4, min_partitions=1)
    assert [[e.size for e in g] for g in groups] == [[30], [10, 1, 1, 0]]
    assert sum(len(g) for g in groups) == len(entries)


def test_spark_size_settings_in_bytes():
    assert byte_size("134217728b") == 128 << 20 and byte_size("4MB") == 4 << 20 and byte_size("512") == 512
    with pytest.raises(Exception, match="not a size in bytes"):
        byte_size("lots")


def test_arrow_fs_does_what_hadoop_fs_does_on_local_paths(tmp_path):
    fs = ArrowFS()
    out = f"file://{tmp_path}/out"
    assert not fs.exists(out) and fs.list_names(out) == []
    fs.write_text(out + "/deep/_summary.json", '{"images": 3}')  # parents made, as Hadoop's create makes them
    assert fs.read_text(out + "/deep/_summary.json") == '{"images": 3}'
    assert fs.exists(out) and fs.list_names(out) == ["deep"]
    fs.rename(out, f"file://{tmp_path}/published")
    assert not fs.exists(out) and fs.exists(str(tmp_path / "published" / "deep" / "_summary.json"))
    with pytest.raises(OSError, match="could not rename"):
        fs.rename(out, f"file://{tmp_path}/again")
    fs.delete(f"file://{tmp_path}/published")
    fs.delete(f"file://{tmp_path}/published")  # gone already: nothing to do
    assert not (tmp_path / "published").exists()
    assert fs.qualify(f"file://{tmp_path}/a/../b/") == f"file:{tmp_path}/b"
    assert fs.qualify("s3a://bucket/x/./y/../z") == "s3a://bucket/x/z"
    with pytest.raises(InputError, match="wasbs://c@a/x: no filesystem here serves wasbs:// paths"):
        fs.exists("wasbs://c@a/x")


def test_a_missing_hadoop_connector_names_the_package():
    line = missing_filesystem_error("s3a://bucket/out", "3.4.1")
    assert line == ("s3a://bucket/out: Spark has no Hadoop filesystem for s3a:// paths; add its connector to the "
                    "cluster, e.g. spark-submit --packages org.apache.hadoop:hadoop-aws:3.4.1 (or spark.jars.packages)")


def test_the_tasks_plan_carries_the_storage_options_of_the_listed_source():
    from spark_cnn.formats.encodings import LOCAL_FILES
    from spark_cnn.spark.planning import plan_reading
    from spark_cnn.spark.sources import ImageSource
    from spark_cnn.task.object_store import StorageOptions

    storage = StorageOptions.parse("endpoint=http://127.0.0.1:9000,region=us-east-1")
    reading = plan_reading(ImageSource(None, "images", LOCAL_FILES, has_labels=True, storage=storage))
    assert reading.storage == storage and reading.encoding == LOCAL_FILES
