"""Images in an S3-compatible store (moto's server on 127.0.0.1, started here): listed by the driver, read in the
tasks through pyarrow.fs, one row per object, the same rows as the same files in a local folder."""

from __future__ import annotations

import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from spark_cnn.config import ClassifyConfig, EtlConfig, InferenceOptions, InputOptions
from spark_cnn.errors import InputError
from spark_cnn.models.digits import DIGITS_FACTORY
from spark_cnn.models.spec import ModelSpec
from spark_cnn.spark.classify_job import classify
from spark_cnn.spark.etl_job import run_etl
from spark_cnn.spark.storage import ArrowFS
from spark_cnn.task.object_store import StorageOptions
from tests.sample_images import broken_files, encode, real_image_files, sample_photo, write_files

pytestmark = pytest.mark.spark

BUCKET = "images"
KEYS = {"access_key": "testing", "secret_key": "testing"}  # moto takes any; the tasks get them from the plan
HIDDEN = {"_SUCCESS": b"", ".staging/x.jpg": b"x", "photos/_tmp/y.jpg": b"y"}  # skipped, as Spark skips them


@pytest.fixture(scope="module")
def s3_endpoint():
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        yield f"http://{host}:{port}"
    finally:
        server.stop()


@pytest.fixture(scope="module")
def images(s3_endpoint, tmp_path_factory):
    """The same files in the bucket (under in/) and in a local folder; returns (files, local folder, limit)."""
    files = {**real_image_files(), **broken_files()}
    limit = max(len(data) for data in files.values()) + 1
    files["big/large.jpg"] = encode(sample_photo().resize((1280, 854)), "JPEG", quality=98)
    assert len(files["big/large.jpg"]) > limit
    host = s3_endpoint.removeprefix("http://")
    store = pafs.S3FileSystem(endpoint_override=host, scheme="http", region="us-east-1",
                              allow_bucket_creation=True, **KEYS)
    store.create_dir(BUCKET)
    for key, data in {**files, **HIDDEN}.items():
        with store.open_output_stream(f"{BUCKET}/in/{key}") as f:
            f.write(data)
    local = write_files(str(tmp_path_factory.mktemp("same_images")), files)
    return files, local, limit


def _rows(output: str, root: str) -> dict[str, dict]:
    rows = pq.read_table(output).to_pylist()
    by_name = {row["path"].split(root, 1)[1].lstrip("/"): row for row in rows}
    assert len(by_name) == len(rows)
    return by_name


def test_objects_are_listed_and_read_in_the_tasks_as_local_files_are(spark, demo_assets, images, s3_endpoint,
                                                                     monkeypatch, tmp_path):
    files, local, limit = images
    # The driver's environment names the endpoint (its listing reads it); the tasks, in Spark's workers started
    # before it was set, get it, the region and the keys from the plan.
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_endpoint)
    for name in ("AWS_REGION", "AWS_DEFAULT_REGION", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(name, raising=False)
    options = InferenceOptions(ModelSpec(DIGITS_FACTORY, demo_assets.weights), max_file_bytes=limit)
    from_store = classify(ClassifyConfig(f"s3://{BUCKET}/in", str(tmp_path / "s3_out"), options,
                                         InputOptions(storage_options=KEYS)), spark=spark)
    from_folder = classify(ClassifyConfig(local, str(tmp_path / "local_out"), options), spark=spark)

    stored, listed = _rows(str(tmp_path / "s3_out"), f"s3://{BUCKET}/in"), _rows(str(tmp_path / "local_out"), local)
    assert set(stored) == set(files)  # one row per object; hidden names skipped
    failed = {name: row["error"] for name, row in stored.items() if row["error"] is not None}
    assert set(failed) == {"broken/truncated.jpg", "broken/notes.txt", "broken/empty.png", "big/large.jpg"}
    assert failed["broken/empty.png"] == "empty file (0 bytes)"
    assert failed["big/large.jpg"].startswith(f"file too large: {len(files['big/large.jpg'])} bytes")
    # Labels and errors exactly; scores within float rounding, which depends on which rows share a device batch.
    columns = ("label", "error", "true_label")
    assert {n: (tuple(r[c] for c in columns), [t["label"] for t in r["topk"] or []])
            for n, r in stored.items()} == \
        {n: (tuple(r[c] for c in columns), [t["label"] for t in r["topk"] or []]) for n, r in listed.items()}
    for name, row in stored.items():
        scores = [row["score"]] + [t["score"] for t in row["topk"] or []] if row["score"] is not None else []
        other = listed[name]
        expected = [other["score"]] + [t["score"] for t in other["topk"] or []] if other["score"] is not None else []
        assert scores == pytest.approx(expected, rel=1e-5, abs=1e-7), name
    assert (from_store["images"], from_store["errors"]) == (from_folder["images"], from_folder["errors"]) == \
        (len(files), 4)


def test_the_etl_takes_each_object_once(spark, demo_assets, images, s3_endpoint, tmp_path):
    files, _, limit = images
    storage = {**KEYS, "endpoint": s3_endpoint, "region": "us-east-1"}
    config = EtlConfig(ClassifyConfig(f"s3://{BUCKET}/in/photos", str(tmp_path / "out"),
                                      InferenceOptions(ModelSpec(DIGITS_FACTORY, demo_assets.weights),
                                                       max_file_bytes=limit),
                                      InputOptions(glob="*.jpg", storage_options=storage), quiet=True),
                       checkpoint=str(tmp_path / "checkpoint"), settle_s=0)
    first = run_etl(config, spark=spark)
    photos = {name for name in files if name.startswith("photos/") and name.endswith(".jpg")}
    rows = _rows(str(tmp_path / "out"), f"s3://{BUCKET}/in")
    assert set(rows) == photos and all(row["error"] is None for row in rows.values())
    assert (first["images"], first["errors"]) == (len(photos), 0)
    assert run_etl(config, spark=spark)["images"] == 0  # taken once


def _jobs_run(spark) -> int:
    return len(spark.sparkContext.statusTracker().getJobIdsForGroup())


@pytest.mark.parametrize("case", ["unreachable endpoint", "missing bucket", "nothing there", "s3a output"])
def test_bad_storage_stops_before_any_spark_job_with_one_line(spark, demo_assets, images, s3_endpoint, case,
                                                              tmp_path):
    storage = {**KEYS, "endpoint": "http://127.0.0.1:1" if case == "unreachable endpoint" else s3_endpoint}
    source = {"missing bucket": "s3://no-such-bucket/in", "nothing there": f"s3://{BUCKET}/nowhere"}.get(
        case, f"s3://{BUCKET}/in")
    output = f"s3a://{BUCKET}/out" if case == "s3a output" else str(tmp_path / "out")
    expected = {"unreachable endpoint": "s3://images/in: cannot reach the storage endpoint .*; set AWS_ENDPOINT_URL "
                                        "or --storage-option endpoint=",
                "missing bucket": "s3://no-such-bucket/in: the bucket does not exist",
                "nothing there": "input s3://images/nowhere does not exist",
                "s3a output": "s3a://images/out: Spark has no Hadoop filesystem for s3a:// paths; .* --packages "
                              "org.apache.hadoop:hadoop-aws:3"}[case]
    before = _jobs_run(spark)
    with pytest.raises(InputError, match=expected) as raised:
        classify(ClassifyConfig(source, output, InferenceOptions(ModelSpec(DIGITS_FACTORY, demo_assets.weights)),
                                InputOptions(storage_options=storage)), spark=spark)
    assert "\n" not in str(raised.value)
    assert _jobs_run(spark) == before, "a Spark job ran before the storage error"


def test_arrow_fs_publishes_on_a_store_as_hadoop_fs_does(images, s3_endpoint):
    fs = ArrowFS(StorageOptions.parse({**KEYS, "endpoint": s3_endpoint, "region": "us-east-1"}))
    staging, output = f"s3://{BUCKET}/jobs/.out.tmp", f"s3://{BUCKET}/jobs/out"
    fs.write_text(staging + "/part-0.txt", "rows")
    fs.write_text(staging + "/_summary.json", "{}")
    assert fs.exists(staging) and not fs.exists(output)
    fs.rename(staging, output)  # a store has no rename: copied, then the source deleted
    assert not fs.exists(staging) and sorted(fs.list_names(output)) == ["_summary.json", "part-0.txt"]
    assert fs.read_text(output + "/part-0.txt") == "rows"
    assert fs.list_names(f"s3://{BUCKET}/jobs") == ["out"]
    fs.delete(output)
    assert not fs.exists(output) and fs.list_names(output) == []


@pytest.mark.parametrize("output_scheme", ["s3a", "s3n"])
def test_overwrite_onto_the_input_under_another_scheme_alias_is_refused_and_every_object_survives(
        demo_assets, images, s3_endpoint, output_scheme):
    # s3a:// and s3n:// are Hadoop's names for the s3:// bucket the input is read from: --overwrite would
    # publish by deleting the input.
    storage = {**KEYS, "endpoint": s3_endpoint, "region": "us-east-1"}
    store = ArrowFS(StorageOptions.parse(storage))
    before = {info.path: store.read_bytes(f"s3://{info.path}") for info in _objects(store, f"{BUCKET}/in")}
    assert len(before) > 10
    config = ClassifyConfig(f"s3://{BUCKET}/in", f"{output_scheme}://{BUCKET}/in", InferenceOptions(
        ModelSpec(DIGITS_FACTORY, demo_assets.weights)), InputOptions(storage_options=storage), overwrite=True)
    with pytest.raises(InputError, match=f"output {output_scheme}://images/in is the input") as raised:
        classify(config)  # no session given: the refusal comes before one would start
    assert "\n" not in str(raised.value)
    assert {info.path: store.read_bytes(f"s3://{info.path}") for info in _objects(store, f"{BUCKET}/in")} == before


def _objects(store: ArrowFS, prefix: str):
    fs, _ = store._fs_path(f"s3://{prefix}")
    return [info for info in fs.get_file_info(pafs.FileSelector(prefix, recursive=True))
            if info.type == pafs.FileType.File]
