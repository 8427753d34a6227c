"""`--output raw`: a model that is not a classifier, its one output tensor per image as `raw` (row-major values)
and `shape`; the layout, the reply shaping, the model check and the runner on the CPU, against plain torch."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
import torch

from spark_cnn.config import ClassifyConfig, InferenceOptions
from spark_cnn.errors import ConfigError, ModelError, SidecarError
from spark_cnn.imaging.preprocess import Preprocessing
from spark_cnn.models.heads import Predictor
from spark_cnn.models.resolve import resolve_endpoint
from spark_cnn.models.spec import ModelSpec
from spark_cnn.models.tensors import normalise
from spark_cnn.sidecar.reply import reply_batch
from spark_cnn.sidecar.runner import ModelRunner
from spark_cnn.task import protocol
from spark_cnn.task.schema import ERROR, RAW, output_schema, reply_schema, spark_ddl, spark_type, udf_output_type
from tests.sidecar_doubles import RAW_GRID_FACTORY, TWO_HEADS_FACTORY, RawGrid

CPU = torch.device("cpu")


def test_the_raw_layout_is_path_raw_shape_error():
    assert spark_ddl(output_schema(output_kind=RAW)) == "path string, raw array<float>, shape array<int>, error string"
    assert reply_schema(output_kind=RAW).names == ["raw", "shape", ERROR]  # the task adds `path`
    assert spark_type(udf_output_type(RAW)) == "struct<raw:array<float>,shape:array<int>,error:string>"
    with pytest.raises(ValueError, match="output kind 'boxes'"):
        output_schema(output_kind="boxes")


def test_raw_rows_hold_each_images_values_in_row_major_order_and_its_shape():
    values = np.arange(4 * 2 * 3 * 3, dtype=np.float32).reshape(4, 2, 3, 3)[:, :, ::-1]  # not contiguous
    schema = reply_schema(output_kind=RAW)
    batch = protocol.decode_outputs(protocol.encode_outputs(reply_batch({"raw": values}, None, schema)))

    assert batch.schema.equals(schema) and batch.num_rows == 4
    for row, image in zip(batch.to_pylist(), values, strict=True):
        assert row["shape"] == [2, 3, 3] and row[ERROR] is None
        assert np.array_equal(np.reshape(row["raw"], row["shape"]), image)


def test_failed_rows_keep_their_place_in_a_raw_reply():
    values = np.random.default_rng(1).standard_normal((2, 5)).astype(np.float32)
    batch = reply_batch({"raw": values}, [None, "cannot decode", None], reply_schema(output_kind=RAW))
    rows = batch.to_pylist()
    assert [r[ERROR] for r in rows] == [None, "cannot decode", None]
    assert rows[1]["raw"] is None and rows[1]["shape"] is None
    assert np.array_equal([rows[0]["raw"], rows[2]["raw"]], values) and rows[2]["shape"] == [5]


def test_one_value_per_image_has_an_empty_shape_and_a_scalar_is_refused():
    batch = reply_batch({"raw": np.array([0.5, 2.0], np.float32)}, None, reply_schema(output_kind=RAW))
    assert batch.column("raw").to_pylist() == [[0.5], [2.0]] and batch.column("shape").to_pylist() == [[], []]
    assert batch.column("shape").type == pa.list_(pa.int32())
    with pytest.raises(SidecarError, match=r"shape \(\)"):
        reply_batch({"raw": np.float32(1.0)}, None, reply_schema(output_kind=RAW))


def test_the_predictor_returns_one_tensor_and_refuses_others_naming_them():
    images = torch.rand(3, 3, 8, 8)
    raw = Predictor(RawGrid(), top_k=1, raw=True).predict(images)
    assert set(raw) == {"raw"} and raw["raw"].dtype == torch.float32
    assert torch.equal(raw["raw"], torch.nn.functional.adaptive_avg_pool2d(images[:, :2], 3))

    class Returns(torch.nn.Module):
        def __init__(self, make):
            super().__init__()
            self.make = make

        def forward(self, x):
            return self.make(x)

    with pytest.raises(ModelError, match=r"returned a dict with keys out, aux: wrap it"):
        Predictor(Returns(lambda x: {"out": x, "aux": x}), top_k=1, raw=True).predict(images)
    with pytest.raises(ModelError, match=r"returned a tuple of 2: tensor \(3, 3, 8, 8\), int"):
        Predictor(Returns(lambda x: (x, 1)), top_k=1, raw=True).predict(images)
    with pytest.raises(ModelError, match=r"shape \(8,\) for 3 image\(s\)"):
        Predictor(Returns(lambda x: x[0, 0, 0]), top_k=1, raw=True).predict(images)
    ints = Predictor(Returns(lambda x: (x > 0.5).long()), top_k=1, raw=True).predict(images)["raw"]
    assert ints.dtype == torch.float32 and set(ints.unique().tolist()) <= {0.0, 1.0}
    with pytest.raises(ModelError, match="for any other tensor use --output raw"):
        Predictor(RawGrid(), top_k=1).predict(images)


def test_the_model_check_passes_a_non_classifier_only_with_output_raw():
    resolved = resolve_endpoint(ModelSpec(RAW_GRID_FACTORY), output_kind=RAW)
    assert resolved.num_classes is None and resolved.raw_shape == (2, 3, 3)
    assert resolved.endpoint.output_kind == RAW
    classes = resolve_endpoint(ModelSpec("spark_cnn.models.digits:digits_cnn"))
    as_raw = resolve_endpoint(ModelSpec("spark_cnn.models.digits:digits_cnn"), output_kind=RAW)
    assert as_raw.endpoint.fingerprint != classes.endpoint.fingerprint  # one sidecar may host both
    # a 4-D output looks like a segmenter's: the line names both ways to run it
    with pytest.raises(ConfigError, match=rf"--model {RAW_GRID_FACTORY} is a segmenter.*use --output raw"):
        resolve_endpoint(ModelSpec(RAW_GRID_FACTORY))
    with pytest.raises(ModelError, match="returned a dict with keys out, aux"):
        resolve_endpoint(ModelSpec(TWO_HEADS_FACTORY), output_kind=RAW)


def test_heads_and_class_partitions_are_refused_with_output_raw():
    spec = ModelSpec(RAW_GRID_FACTORY)
    for heads, named in (({"top_k": 3}, "--top-k"), ({"labels": ["a"]}, "--labels"), ({"logits": True}, "--logits"),
                         ({"embeddings": True}, "--embeddings")):
        with pytest.raises(ConfigError, match=f"--output raw .*drop {named}$"):
            InferenceOptions(spec, output_kind=RAW, **heads)
    with pytest.raises(ConfigError, match="--output boxes: expected one of classes, raw"):
        InferenceOptions(spec, output_kind="boxes")
    with pytest.raises(ConfigError, match="--partition-by label: --output raw writes no classes"):
        ClassifyConfig("in/", "out/", InferenceOptions(spec, output_kind=RAW), partition_by="label")


def test_the_runner_replies_with_the_models_own_output():
    endpoint = resolve_endpoint(ModelSpec(RAW_GRID_FACTORY), output_kind=RAW).endpoint
    pixels = np.random.default_rng(2).integers(0, 256, (5, 224, 224, 3), dtype=np.uint8)
    runner = ModelRunner(endpoint, CPU)
    batch = reply_batch(runner.run(pixels), None, runner.reply_schema)
    with torch.inference_mode():
        expected = RawGrid()(normalise(torch.from_numpy(pixels), Preprocessing())).numpy()
    assert runner.precision == "fp32"
    for row, image in zip(batch.to_pylist(), expected, strict=True):
        np.testing.assert_allclose(np.reshape(row["raw"], row["shape"]), image, rtol=1e-6, atol=1e-6)
