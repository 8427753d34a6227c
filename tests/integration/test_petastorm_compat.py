"""Petastorm compatibility against the real petastorm 0.13.1, in its own pinned environment (petastorm_env.py).

(a) a dataset `spark-cnn to-petastorm` wrote opens in petastorm's make_reader and make_batch_reader with the
    images and fields we wrote; (b) a dataset petastorm's materialize_dataset wrote (pyspark 3.5) is read by
    the classify job, one row per record, with the logits of direct torch.
Our side runs the jobs `spark-cnn to-petastorm` and `spark-cnn classify` run, in the shared local Spark session
(the flags' way into their configs is tests/unit/cli/test_option_reach.py's); petastorm's side runs in its own
processes. The first run builds the environment (~1 minute with a warm pip cache); later runs reuse it.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from PIL import Image
from torchvision import transforms

from spark_cnn.config import ClassifyConfig, InferenceOptions, InputOptions, PetastormConfig
from spark_cnn.formats import petastorm
from spark_cnn.imaging.pixels import rgb_from_npy
from spark_cnn.imaging.preprocess import decode_rgb
from spark_cnn.models.digits import DIGITS_FACTORY, DIGITS_PREPROCESSING, DigitsCNN
from spark_cnn.models.spec import ModelSpec
from spark_cnn.spark.classify_job import classify
from spark_cnn.spark.petastorm_job import to_petastorm
from tests.e2e.cached_env import EnvBuildError, cached_python, python_or_fail
from tests.e2e.conftest import run_command
from tests.e2e.petastorm_env import PETASTORM_ENV, petastorm_python

pytestmark = [pytest.mark.spark, pytest.mark.petastorm]
SCRIPTS = os.path.join(os.path.dirname(os.path.dirname(__file__)), "e2e", "petastorm_scripts")
DIGITS_PER_CLASS = 6


@pytest.fixture(scope="module")
def petastorm_env() -> str:
    return python_or_fail(petastorm_python)


def _run_in_env(python: str, script: str, *args: str) -> None:
    env = {**os.environ, "PYSPARK_PYTHON": python, "PYSPARK_DRIVER_PYTHON": python}
    for name in ("PYTHONPATH", "SPARK_HOME", "SPARK_CONF_DIR"):  # nothing of spark_cnn's Spark 4 set-up
        env.pop(name, None)
    done = run_command([python, os.path.join(SCRIPTS, script), *args], env=env)
    assert done.returncode == 0, done.stderr[-3000:]


def _image_folder(root: str) -> dict[str, tuple[str | None, np.ndarray | None]]:
    """Class folders with RGB, gray and RGBA PNGs, an EXIF-rotated JPEG and a broken file:
    file name -> (class, the RGB pixels our decoder gives, or None for the broken file)."""
    rng = np.random.default_rng(7)
    images = {
        "cat/rgb.png": Image.fromarray(rng.integers(0, 256, (21, 34, 3), dtype=np.uint8)),
        "cat/gray.png": Image.fromarray(rng.integers(0, 256, (16, 12), dtype=np.uint8), mode="L"),
        "dog/rgba.png": Image.fromarray(rng.integers(0, 256, (9, 30, 4), dtype=np.uint8), mode="RGBA"),
    }
    expected = {}
    for name, image in images.items():
        os.makedirs(os.path.join(root, os.path.dirname(name)), exist_ok=True)
        image.save(os.path.join(root, name))
    rotated = Image.fromarray(rng.integers(0, 256, (10, 20, 3), dtype=np.uint8))
    exif = rotated.getexif()
    exif[0x0112] = 6  # orientation: rotate 90 degrees when shown
    rotated.save(os.path.join(root, "dog/rotated.jpg"), exif=exif, quality=95)
    with open(os.path.join(root, "dog/broken.jpg"), "wb") as f:
        f.write(b"this is not a JPEG")
    for name in [*images, "dog/rotated.jpg", "dog/broken.jpg"]:
        with open(os.path.join(root, name), "rb") as f:
            data = f.read()
        pixels = None if name.endswith("broken.jpg") else np.asarray(decode_rgb(data))
        expected[name] = (name.split("/")[0], pixels)
    return expected


def test_petastorm_reads_what_to_petastorm_wrote(spark, petastorm_env, tmp_path):
    folder, dataset, dumped = str(tmp_path / "images"), str(tmp_path / "dataset"), str(tmp_path / "read.npz")
    expected = _image_folder(folder)
    summary = to_petastorm(PetastormConfig(folder, dataset, quiet=True), spark=spark)
    assert (summary["images"], summary["errors"]) == (len(expected), 1)

    _run_in_env(petastorm_env, "read_with_petastorm.py", "file://" + dataset, dumped)

    with np.load(dumped) as read:
        rows = json.loads(str(read["rows"]))
        arrays = {key: read[key] for key in read.files if key != "rows"}
    assert rows["fields"] == ["path", "image", "label", "error"]
    for reader in ("reader", "batch_reader"):
        seen = {}
        for row in rows[reader]:
            name = row["path"].split(f"{folder}/", 1)[1]
            label, pixels = expected[name]
            assert row["label"] == label
            key = f"{'reader' if reader == 'reader' else 'batch'}_{row['i']}"
            if pixels is None:
                assert key not in arrays and "cannot decode" in row["error"]
            else:
                # make_batch_reader casts string columns to the field's numpy type (np.str_): a null becomes 'None'.
                assert row["error"] is None or (reader == "batch_reader" and row["error"] == "None")
                image = arrays[key] if reader == "reader" else np.asarray(Image.open(io.BytesIO(arrays[key].tobytes())))
                np.testing.assert_array_equal(image, pixels)  # PNG is lossless: exactly the pixels we decoded
            seen[name] = row
        assert set(seen) == set(expected), reader  # one row per input file, in both readers


@pytest.mark.parametrize("codec", ["ndarray", "jpeg"])
def test_petastorm_reads_every_codec_we_write(petastorm_env, codec, tmp_path):
    """The layout for the other codecs, written by the pure core (no Spark): make_reader decodes our images."""
    # Smooth colour gradients: JPEG keeps them close, so a channel swap or a wrong layout would show.
    rgb = []
    for h in (16, 24, 40):
        y, x = np.mgrid[0:h, 0:2 * h]
        rgb.append(np.stack([x * 255 // (2 * h), y * 255 // h, np.full_like(x, 200)], axis=2).astype(np.uint8))
    dataset, dumped = tmp_path / "dataset", str(tmp_path / "read.npz")
    os.makedirs(dataset)
    pq.write_table(pa.table({"path": [f"p{i}" for i in range(len(rgb))],
                             "image": pa.array([petastorm.encode_image(p, codec) for p in rgb], pa.binary()),
                             "error": pa.nulls(len(rgb), pa.string())}), str(dataset / "part-0.parquet"))
    with open(dataset / petastorm.COMMON_METADATA, "wb") as f:
        f.write(petastorm.common_metadata(petastorm.image_unischema(codec, with_label=False), {"part-0.parquet": 1}))

    _run_in_env(petastorm_env, "read_with_petastorm.py", "file://" + str(dataset), dumped)

    with np.load(dumped) as read:
        rows = json.loads(str(read["rows"]))
        for row in rows["reader"]:
            image, expected = read[f"reader_{row['i']}"], rgb[int(row["path"][1:])]
            assert image.shape == expected.shape and image.dtype == np.uint8
            if codec == "ndarray":
                np.testing.assert_array_equal(image, expected)
            else:  # lossy: OpenCV's decode of our JPEG is close to the pixels we encoded
                assert np.abs(image.astype(int) - expected).mean() < 3
    assert sorted(r["path"] for r in rows["reader"]) == ["p0", "p1", "p2"]
    assert sorted(r["path"] for r in rows["batch_reader"]) == ["p0", "p1", "p2"]


def test_classify_reads_what_petastorm_wrote(spark, petastorm_env, demo_assets, tmp_path):
    rgb, labels = [], []
    for digit in range(10):
        folder = os.path.join(demo_assets.images, str(digit))
        for name in sorted(os.listdir(folder))[:DIGITS_PER_CLASS]:
            with open(os.path.join(folder, name), "rb") as f:
                rgb.append(np.asarray(decode_rgb(f.read())))
            labels.append(digit)
    np.save(tmp_path / "images.npy", np.stack(rgb))
    np.save(tmp_path / "labels.npy", np.array(labels, dtype=np.int32))
    dataset = str(tmp_path / "digits")
    _run_in_env(petastorm_env, "write_with_petastorm.py", str(tmp_path / "images.npy"), str(tmp_path / "labels.npy"),
                "file://" + dataset)

    model = DigitsCNN()
    model.load_state_dict(torch.load(demo_assets.weights, weights_only=True))
    model.eval()
    prep = DIGITS_PREPROCESSING
    pipeline = transforms.Compose([transforms.Resize(prep.resize), transforms.CenterCrop(prep.crop),
                                   transforms.ToTensor(), transforms.Normalize(prep.mean, prep.std)])
    with torch.inference_mode():
        reference = model(torch.stack([pipeline(Image.fromarray(p)) for p in rgb])).numpy()

    # One job, on the CompressedImageCodec field (what most petastorm image datasets use). The NdarrayCodec
    # field's bytes are checked below; the job's path for such arrays is covered in test_input_formats.py.
    output = str(tmp_path / "out")
    classify(ClassifyConfig(dataset, output, InferenceOptions(ModelSpec(DIGITS_FACTORY, demo_assets.weights),
                                                              labels=demo_assets.labels, logits=True),
                            InputOptions(image_column="image", path_column="id", label_column="label"),
                            quiet=True), spark=spark)
    rows = {r["path"]: r for r in pq.read_table(output).to_pylist()}
    assert sorted(rows) == [f"digit-{i:04d}" for i in range(len(rgb))]  # one row per record, ids kept
    for i, r in enumerate(rows[f"digit-{i:04d}"] for i in range(len(rgb))):
        assert r["error"] is None and r["true_label"] == str(labels[i])
        np.testing.assert_allclose(r["logits"], reference[i], rtol=1e-4, atol=1e-4)
    with open(os.path.join(output, "_summary.json")) as f:
        summary = json.load(f)
    correct = np.mean(reference.argmax(axis=1) == np.array(labels))
    assert summary["images"] == len(rgb) and summary["errors"] == 0
    assert summary["accuracy"] == pytest.approx(correct, abs=1e-4) and correct >= 0.9

    stored = pq.read_table(dataset, columns=["id", "pixels"]).to_pydict()
    for row_id, data in zip(stored["id"], stored["pixels"], strict=True):
        np.testing.assert_array_equal(rgb_from_npy(data), rgb[int(row_id.split("-")[1])])


def test_env_build_failure_is_clear(tmp_path, monkeypatch):
    """A requirement pip cannot satisfy fails the set-up with pip's words, and leaves no half-built env."""
    monkeypatch.setenv(PETASTORM_ENV.cache_root_env, str(tmp_path))
    # A requirement pip rejects before asking any package index.
    broken = dataclasses.replace(PETASTORM_ENV, requirements=("petastorm===not a version",))
    with pytest.raises(EnvBuildError, match="cannot build the petastorm test environment"):
        cached_python(broken)
    assert not os.path.exists(broken.directory())
