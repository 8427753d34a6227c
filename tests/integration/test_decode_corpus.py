"""The classify job over the decoding corpus (issue #5): scikit-image's data folder, scikit-learn's photos and
generated broken files. Every file gives exactly one row; the broken ones, and only they, carry an error, and
the same error whether the Spark tasks or the sidecar decode. A small random digits CNN keeps it fast."""

from __future__ import annotations

import os
from urllib.parse import urlparse

import pyarrow.parquet as pq
import pytest

from spark_cnn.config import ClassifyConfig, InferenceOptions
from spark_cnn.errors import ImageError
from spark_cnn.models.digits import DIGITS_FACTORY
from spark_cnn.models.spec import ModelSpec
from spark_cnn.spark.classify_job import classify
from tests.sample_images import (
    CORPUS_MAX_FILE_BYTES,
    CORPUS_MAX_PIXELS,
    corpus_broken_files,
    decoding_corpus,
    sklearn_photo_files,
    write_files,
)

pytestmark = pytest.mark.spark

EXPECTED_ERRORS = {  # file -> the start of its error
    "broken/truncated.jpg": "cannot decode image: OSError: image file is truncated",
    "broken/zero_bytes.jpg": "empty file (0 bytes)",
    "broken/random_bytes.jpg": "cannot decode image: UnidentifiedImageError",
    "broken/text_named.jpg": "cannot decode image: UnidentifiedImageError",
    "broken/too_many_pixels.png": "image too large: 2000x1600",
    "broken/too_many_bytes.png": "file too large:",
}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> str:
    return write_files(str(tmp_path_factory.mktemp("corpus")), decoding_corpus())


def _config(folder: str, output: str, **kwargs) -> ClassifyConfig:
    return ClassifyConfig(folder, output, InferenceOptions(ModelSpec(DIGITS_FACTORY), max_pixels=CORPUS_MAX_PIXELS,
                                                           max_file_bytes=CORPUS_MAX_FILE_BYTES, **kwargs))


@pytest.mark.parametrize("decode", ["task", "sidecar"])
def test_every_corpus_file_gives_one_row_and_only_broken_ones_an_error(spark, corpus, tmp_path, decode):
    output = str(tmp_path / "out")
    summary = classify(_config(corpus, output, decode=decode), spark=spark)

    rows = pq.read_table(output).to_pylist()
    by_file = {os.path.relpath(urlparse(r["path"]).path, corpus): r for r in rows}
    assert len(by_file) == len(rows) == len(decoding_corpus())  # one row per file, none twice
    assert set(by_file) == set(decoding_corpus())
    assert set(EXPECTED_ERRORS) == set(corpus_broken_files())
    for name, row in by_file.items():
        if name in EXPECTED_ERRORS:
            assert row["error"] is not None and row["error"].startswith(EXPECTED_ERRORS[name]), (name, row["error"])
            assert row["label"] is None and row["topk"] is None
        else:
            assert row["error"] is None, (name, row["error"])
            assert row["label"] is not None and len(row["topk"]) == 5
    assert summary["images"] == len(rows) and summary["errors"] == len(EXPECTED_ERRORS)


def test_on_error_fail_names_the_file_a_guard_rail_refused(spark, tmp_path):
    files = {**sklearn_photo_files(), "big/too_many_pixels.png": corpus_broken_files()["broken/too_many_pixels.png"]}
    folder = write_files(str(tmp_path / "in"), files)
    with pytest.raises(ImageError, match=r"too_many_pixels\.png: image too large: 2000x1600 = 3200000 pixels"):
        classify(_config(folder, str(tmp_path / "out"), on_error="fail"), spark=spark)
    assert not (tmp_path / "out").exists()
