"""Input formats on a real local Spark: the same pictures as an image folder, through Spark's image source, as a
Parquet table and as a Petastorm dataset give the same rows and the same logits; globs, class folders,
partitioned output, auto-detection."""

from __future__ import annotations

import io
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

from spark_cnn.config import ClassifyConfig, InferenceOptions, InputOptions
from spark_cnn.errors import ConfigError
from spark_cnn.formats import petastorm
from spark_cnn.formats.encodings import LOCAL_FILES
from spark_cnn.imaging.preprocess import decode_rgb
from spark_cnn.models.digits import DIGITS_FACTORY
from spark_cnn.models.spec import ModelSpec
from spark_cnn.spark.classify_job import classify
from spark_cnn.spark.sources import detect_format, open_source
from spark_cnn.task.files import listed_local_path, read_listed_file

pytestmark = pytest.mark.spark
BROKEN = ("dog/broken.png", "cat/empty.png")


@pytest.fixture(scope="module")
def pictures(tmp_path_factory) -> str:
    """ImageFolder layout: cat/ and dog/ with RGB, gray and RGBA PNGs, a broken and an empty file; a text file."""
    root = str(tmp_path_factory.mktemp("pictures"))
    rng = np.random.default_rng(3)
    images = {"cat/rgb.png": Image.fromarray(rng.integers(0, 256, (30, 44, 3), dtype=np.uint8)),
              "cat/gray.png": Image.fromarray(rng.integers(0, 256, (25, 25), dtype=np.uint8), mode="L"),
              "dog/rgba.png": Image.fromarray(rng.integers(0, 256, (40, 31, 4), dtype=np.uint8), mode="RGBA"),
              "dog/wide.png": Image.fromarray(rng.integers(0, 256, (20, 60, 3), dtype=np.uint8))}
    for name, image in images.items():
        os.makedirs(os.path.join(root, os.path.dirname(name)), exist_ok=True)
        image.save(os.path.join(root, name))
    with open(os.path.join(root, "dog/broken.png"), "wb") as f:
        f.write(rng.bytes(300))
    open(os.path.join(root, "cat/empty.png"), "wb").close()
    with open(os.path.join(root, "readme.txt"), "w") as f:
        f.write("not an image, and not a .png")
    return root


def _pngs(root: str) -> dict[str, bytes]:
    found = {}
    for folder in ("cat", "dog"):
        for name in sorted(os.listdir(os.path.join(root, folder))):
            with open(os.path.join(root, folder, name), "rb") as f:
                found[f"{folder}/{name}"] = f.read()
    return found


def _rows(output: str, key=lambda path: path) -> dict[str, dict]:
    rows = pq.read_table(output).to_pylist()
    by_key = {key(r["path"]): r for r in rows}
    assert len(by_key) == len(rows), "an input appears twice in the output"
    return by_key


def _classify(spark, demo_assets, source: str, output: str, **options):
    inputs = InputOptions(**{k: options.pop(k) for k in list(options) if k in InputOptions.__dataclass_fields__})
    model = InferenceOptions(ModelSpec(DIGITS_FACTORY, demo_assets.weights), logits=True)
    return classify(ClassifyConfig(source, output, model, inputs=inputs, **options), spark=spark)


def _assert_same_outputs(rows: dict[str, dict], reference: dict[str, dict]) -> None:
    assert set(rows) == set(reference)
    for name, row in rows.items():
        if name in BROKEN:
            assert row["error"] and row["logits"] is None, name
        else:
            assert row["error"] is None, (name, row["error"])
            np.testing.assert_allclose(row["logits"], reference[name]["logits"], rtol=1e-5, atol=1e-6)


def test_every_input_format_gives_the_same_rows_and_logits(spark, demo_assets, pictures, tmp_path):
    relative = lambda path: path.split(f"{pictures}/", 1)[1]  # noqa: E731
    assert detect_format(spark, "file://" + pictures) == "images"

    # Image folder, *.png only: readme.txt is no input; class folders are the true labels.
    summary = _classify(spark, demo_assets, pictures, str(tmp_path / "folder"), glob="*.png")
    folder = _rows(str(tmp_path / "folder"), relative)
    assert set(folder) == set(_pngs(pictures)) and summary["errors"] == 2
    assert all(row["true_label"] == name.split("/")[0] for name, row in folder.items())
    assert summary["accuracy"] is None  # cat and dog are not class indices, and no --labels names them

    # Spark's image source: BGR pixels, decoded by Spark; the same resize and crop.
    _classify(spark, demo_assets, pictures, str(tmp_path / "image"), format="image", glob="*.png")
    _assert_same_outputs(_rows(str(tmp_path / "image"), relative), folder)

    # Spark's image rows saved as a Parquet table (a struct column): read as image-source rows, ids from origin.
    stored = str(tmp_path / "image-table")
    spark.read.format("image").option("pathGlobFilter", "*.png").option("recursiveFileLookup", "true") \
        .load(pictures).write.parquet(stored)
    _classify(spark, demo_assets, stored, str(tmp_path / "image-parquet"))
    decoded = {n: r for n, r in folder.items() if n not in BROKEN}  # Spark's reader drops zero-byte files
    rows = _rows(str(tmp_path / "image-parquet"), relative)
    assert "could not decode" in rows.pop("dog/broken.png")["error"]
    _assert_same_outputs(rows, decoded)

    # A Parquet table of the files with an id and a class column, plus a row without an image; partitioned.
    files = _pngs(pictures)
    table = pa.table({"id": [*files, "no-image"], "cls": [n.split("/")[0] for n in files] + ["dog"],
                      "data": pa.array([*files.values(), None], pa.binary()),
                      "size": [len(b) for b in files.values()] + [0]})
    os.makedirs(tmp_path / "table")
    pq.write_table(table, str(tmp_path / "table" / "images.parquet"))
    assert detect_format(spark, "file://" + str(tmp_path / "table")) == "parquet"
    _classify(spark, demo_assets, str(tmp_path / "table"), str(tmp_path / "parquet"), image_column="data",
              path_column="id", label_column="cls", partition_by="true_label")
    assert {n for n in os.listdir(tmp_path / "parquet") if "=" in n} == {"true_label=cat", "true_label=dog"}
    parquet = _rows(str(tmp_path / "parquet"))
    assert parquet.pop("no-image")["error"] == "the row has no image (null)"
    _assert_same_outputs(parquet, folder)
    assert all(row["true_label"] == name.split("/")[0] for name, row in parquet.items())

    # A Petastorm dataset (our writer's layout) whose images are raw arrays (NdarrayCodec): decoding is skipped.
    dataset = tmp_path / "petastorm"
    os.makedirs(dataset)
    schema = petastorm.image_unischema("ndarray", with_label=False)
    readable = {n: b for n, b in files.items() if n not in BROKEN}
    arrays = [petastorm.encode_image(np.asarray(decode_rgb(b)), "ndarray") for b in readable.values()]
    pq.write_table(pa.table({"path": list(readable), "image": pa.array(arrays, pa.binary()),
                             "error": pa.nulls(len(readable), pa.string())}), str(dataset / "part-0.parquet"))
    with open(dataset / petastorm.COMMON_METADATA, "wb") as f:
        f.write(petastorm.common_metadata(schema, {"part-0.parquet": 1}))
    assert detect_format(spark, "file://" + str(dataset)) == "petastorm"
    _classify(spark, demo_assets, str(dataset), str(tmp_path / "from-petastorm"))
    rows = _rows(str(tmp_path / "from-petastorm"))
    _assert_same_outputs(rows, {n: r for n, r in folder.items() if n not in BROKEN})


def test_partition_by_true_label_needs_a_label_column(spark, demo_assets, pictures, tmp_path):
    table = tmp_path / "table"
    os.makedirs(table)
    buffer = io.BytesIO()
    Image.new("RGB", (8, 8)).save(buffer, format="PNG")
    pq.write_table(pa.table({"path": ["a"], "image": [buffer.getvalue()]}), str(table / "t.parquet"))
    with pytest.raises(ConfigError, match="--partition-by true_label: this parquet input has no true labels"):
        _classify(spark, demo_assets, str(table), str(tmp_path / "out"), partition_by="true_label")
    assert not (tmp_path / "out").exists()
    with pytest.raises(ConfigError, match="--glob applies to image files, but .* holds a parquet dataset"):
        _classify(spark, demo_assets, str(table), str(tmp_path / "out"), glob="*.png")


def test_local_image_folders_are_listed_by_the_driver_and_read_by_the_tasks(spark, pictures):
    # Reading the bytes in the JVM (binaryFile content) cost it more CPU per image than the rest of Spark's work;
    # Spark's listing fails on an unreadable subfolder and loops on symlinks (spark/listing.py walks instead).
    local = open_source(spark, "file://" + pictures, InputOptions(glob="*.png"))
    assert local.encoding == LOCAL_FILES
    scan = local.frame._jdf.queryExecution().executedPlan().toString()
    assert "FileScan" not in scan, scan
    assert local.frame.where("content is not null").count() == 0
    assert local.frame.count() == len(_pngs(pictures))  # zero-byte files too (Spark's scan drops them)


def test_the_tasks_find_files_whose_names_look_like_url_syntax(spark, pictures, tmp_path):
    # Spark's listing writes paths unescaped: '#', '?', '%20' and spaces are parts of the names.
    folder = tmp_path / "odd names"
    folder.mkdir()
    some_png = max(_pngs(pictures).values(), key=len)
    for name in ("a b#1.png", "p%20q.png", "é?x.png"):
        (folder / name).write_bytes(some_png)
    listed = [row.path for row in open_source(spark, "file://" + str(folder)).frame.select("path").collect()]
    assert sorted(os.path.basename(listed_local_path(p)) for p in listed) == ["a b#1.png", "p%20q.png", "é?x.png"]
    assert all(read_listed_file(p) == some_png for p in listed)
