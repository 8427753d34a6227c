"""Object-store URIs, --storage-option pairs, what the driver ships to the tasks, and one-line store errors."""

from __future__ import annotations

import pyarrow.fs as pafs
import pytest

from spark_cnn.errors import ConfigError, ImageError, InputError
from spark_cnn.task import object_store
from spark_cnn.task.files import prefetched, read_listed_file
from spark_cnn.task.object_store import (
    NO_STORAGE,
    StorageOptions,
    filesystem,
    for_tasks,
    is_store_fault,
    is_store_uri,
    join_uri,
    split_uri,
    storage_error,
)


def test_options_parse_from_flags_texts_and_mappings():
    flags = StorageOptions.parse(["endpoint=http://127.0.0.1:9000", "region=eu-west-1,anonymous=true"])
    assert flags.pairs == (("anonymous", "true"), ("endpoint", "http://127.0.0.1:9000"), ("region", "eu-west-1"))
    assert StorageOptions.parse({"anonymous": True, "region": "eu-west-1"}).get("anonymous") == "true"
    assert StorageOptions.parse("sas_token=sv=2024&sig=a=b").get("sas_token") == "sv=2024&sig=a=b"  # '=' in values
    assert StorageOptions.parse(None) == NO_STORAGE and not NO_STORAGE
    secret = StorageOptions.parse("access_key=AK,secret_key=hush")
    assert repr(secret) == "StorageOptions(access_key=AK, secret_key=***)"
    with pytest.raises(ConfigError, match="--storage-option endpoint: expected KEY=VALUE"):
        StorageOptions.parse("endpoint")
    with pytest.raises(ConfigError, match="--storage-option regoin: unknown key; valid keys: .*region"):
        StorageOptions.parse("regoin=x")
    with pytest.raises(ConfigError, match=r"\['region'\] given twice"):
        StorageOptions.parse(["region=a", "region=b"])


@pytest.mark.parametrize("uri, split", [
    ("s3://images/cats/a.jpg", ("s3", "images", "images/cats/a.jpg")),
    ("s3a://images/cats/", ("s3", "images", "images/cats")),
    ("gs://bucket", ("gcs", "bucket", "bucket")),
    ("abfs://box@acct.dfs.core.windows.net/x/y.png", ("azure", "box@acct.dfs.core.windows.net", "box/x/y.png")),
    ("az://box/x", ("azure", "box", "box/x")),
    ("hdfs://nn:8020/data/x", ("hdfs", "nn:8020", "/data/x")),
])
def test_uris_split_into_the_store_and_its_path(uri, split):
    assert split_uri(uri) == split
    assert is_store_uri(uri)


def test_listed_paths_come_back_spelled_as_the_input_was():
    assert join_uri("s3a://images/cats", "images/cats/x 1#.jpg") == "s3a://images/cats/x 1#.jpg"
    assert join_uri("abfs://box@acct.dfs.core.windows.net/x", "box/x/a.png") == \
        "abfs://box@acct.dfs.core.windows.net/x/a.png"
    assert join_uri("hdfs://nn:8020/data", "/data/a.png") == "hdfs://nn:8020/data/a.png"


def test_schemes_no_filesystem_serves_are_one_line():
    assert not is_store_uri("wasbs://c@a/x") and not is_store_uri("/local/path") and not is_store_uri("file:/x")
    with pytest.raises(InputError, match="no filesystem here reads ftp paths; use a local path or one of s3://"):
        split_uri("ftp://host/x")
    with pytest.raises(InputError, match="s3:///x: no bucket"):
        split_uri("s3:///x")


def test_the_driver_ships_its_endpoint_and_region_but_not_its_keys():
    environ = {"AWS_ENDPOINT_URL": "http://127.0.0.1:9000", "AWS_ACCESS_KEY_ID": "key",
               "AWS_SECRET_ACCESS_KEY": "secret"}
    shipped = for_tasks("s3://images/x", NO_STORAGE, environ)
    assert shipped.pairs == (("endpoint", "http://127.0.0.1:9000"), ("region", "us-east-1"))
    given = StorageOptions.parse("endpoint=http://other:1,region=eu-west-1")
    assert for_tasks("s3://images/x", given, {**environ, "AWS_REGION": "us-west-2"}) == given  # options win
    assert for_tasks("s3://images/x", NO_STORAGE, {"AWS_ENDPOINT_URL_S3": "http://s3:1", "AWS_ENDPOINT_URL": "http://x",
                                                   "AWS_DEFAULT_REGION": "ap-south-1"}).pairs == \
        (("endpoint", "http://s3:1"), ("region", "ap-south-1"))
    assert for_tasks("gs://bucket/x", NO_STORAGE, environ) == NO_STORAGE


def test_one_filesystem_per_store_and_options_in_a_process(monkeypatch):
    monkeypatch.setattr(object_store, "_filesystems", {})
    options = StorageOptions.parse("endpoint=http://127.0.0.1:9,region=eu-west-1,anonymous=true,connect_timeout=2")
    fs, path = filesystem("s3://images/a/b.jpg", options)
    assert isinstance(fs, pafs.S3FileSystem) and path == "images/a/b.jpg"
    assert fs.region == "eu-west-1"
    assert filesystem("s3a://other/c.jpg", options)[0] is fs  # buckets share a client
    assert filesystem("s3://images/a", NO_STORAGE.with_defaults(region="eu-west-1"))[0] is not fs
    with pytest.raises(ConfigError, match="--storage-option anonymous=maybe: expected a bool value"):
        filesystem("s3://images/x", StorageOptions.parse("anonymous=maybe"))


@pytest.mark.parametrize("message, expected", [
    ("When listing objects under key 'a/' in bucket 'nob': AWS Error NO_SUCH_BUCKET during ListObjectsV2 "
     "operation: The specified bucket does not exist (Request ID: XYZ)",
     "s3://nob/a: the bucket does not exist (check its name, and the endpoint: AWS_ENDPOINT_URL or --storage-option"),
    ("AWS Error NETWORK_CONNECTION during ListObjectsV2 operation: curlCode: 7, Could not connect to server",
     "s3://nob/a: cannot reach the storage endpoint (AWS Error NETWORK_CONNECTION"),
    ("AWS Error ACCESS_DENIED during ListObjectsV2 operation: Access Denied",
     "s3://nob/a: the store refused access (AWS Error ACCESS_DENIED during ListObjectsV2 operation: Access Denied); "
     "set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY"),
])
def test_store_errors_say_what_to_set_in_one_line(message, expected):
    line = storage_error("s3://nob/a", OSError(message))
    assert line.startswith(expected) and "\n" not in line and "Request ID" not in line


def test_prefetched_reads_keep_their_order_and_their_own_errors():
    def read(row: int) -> bytes:
        if row == 3:
            raise ImageError("row 3 is broken")
        return bytes([row])

    results = []
    for row, result in prefetched(read, range(40), in_flight=4):
        try:
            results.append((row, result()))
        except ImageError as e:
            results.append((row, str(e)))
    assert results == [(i, bytes([i]) if i != 3 else "row 3 is broken") for i in range(40)]


def test_a_store_that_cannot_be_reached_fails_the_task_not_the_row(monkeypatch):
    monkeypatch.setattr(object_store, "_filesystems", {})
    nowhere = StorageOptions.parse("endpoint=http://127.0.0.1:1,region=us-east-1,anonymous=true,connect_timeout=1")
    with pytest.raises(InputError, match="s3://images/a.jpg: cannot reach the storage endpoint"):
        read_listed_file("s3://images/a.jpg", storage=nowhere)
    with pytest.raises(InputError, match="pyarrow cannot load HDFS's client"):
        read_listed_file("hdfs://namenode:8020/a.jpg")
    assert is_store_fault(OSError("AWS Error NO_SUCH_BUCKET during GetObject"))
    assert not is_store_fault(FileNotFoundError("Path does not exist 'images/a.jpg'"))
