"""Pure pieces of the notebook API: image structs, named-layer embeddings, options, UDF output frames, embed CLI."""

from __future__ import annotations

import io

import numpy as np
import pyarrow as pa
import pytest
import torch
from PIL import Image

from spark_cnn.cli import build_parser, main
from spark_cnn.cli.classify import classify_config
from spark_cnn.config import ClassifyConfig, InferenceOptions
from spark_cnn.errors import ConfigError, ImageError, ModelError, SidecarError
from spark_cnn.imaging.image_struct import image_struct_to_rgb, is_image_struct, preprocess_image_struct
from spark_cnn.imaging.preprocess import Preprocessing, preprocess_pixels
from spark_cnn.models.digits import DIGITS_FACTORY, DigitsCNN
from spark_cnn.models.heads import Predictor, pool_spatial
from spark_cnn.models.resolve import resolve_endpoint
from spark_cnn.models.spec import ModelSpec
from spark_cnn.sidecar.reply import reply_batch
from spark_cnn.spark.frames import inference_options
from spark_cnn.spark.udf import OUTPUT_TYPES, cnn_udf, output_frame
from spark_cnn.task.launcher import LaunchOptions
from spark_cnn.task.schema import failed_rows, output_schema, reply_schema
from spark_cnn.task.stream import InferencePlan, PendingBatch, assemble


def _struct(rgb: np.ndarray, channels: int = 3) -> dict:
    """A Spark image struct as the image source writes it: BGR(A) or grey bytes, OpenCV mode code."""
    height, width = rgb.shape[:2]
    if channels == 1:
        data, mode = rgb[:, :, 0], 0
    elif channels == 3:
        data, mode = rgb[:, :, ::-1], 16
    else:
        data, mode = np.concatenate([rgb[:, :, ::-1], np.full((height, width, 1), 255, np.uint8)], axis=2), 24
    return {"origin": "file:/x.png", "height": height, "width": width, "nChannels": channels, "mode": mode,
            "data": np.ascontiguousarray(data).tobytes()}


def _png(rgb: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(rgb).save(buf, format="PNG")
    return buf.getvalue()


@pytest.fixture
def photo() -> np.ndarray:
    rng = np.random.default_rng(0)
    return rng.integers(0, 256, size=(48, 64, 3), dtype=np.uint8)


def test_image_struct_bgr_and_bgra_become_the_same_rgb_pixels(photo):
    assert np.array_equal(np.asarray(image_struct_to_rgb(_struct(photo))), photo)
    assert np.array_equal(np.asarray(image_struct_to_rgb(_struct(photo, channels=4))), photo)
    grey = np.repeat(photo[:, :, :1], 3, axis=2)
    assert np.array_equal(np.asarray(image_struct_to_rgb(_struct(grey, channels=1))), grey)


def test_image_struct_preprocessing_equals_the_file_path(photo):
    prep = Preprocessing(resize=40, crop=32)
    assert np.array_equal(preprocess_image_struct(_struct(photo), prep), preprocess_pixels(_png(photo), prep))


@pytest.mark.parametrize("change, message", [
    ({"height": -1, "width": -1, "mode": -1, "nChannels": -1, "data": b""}, "not a decoded image"),
    ({"mode": 21}, "unsupported image mode"),
    ({"data": b"\0" * 10}, "image data has 10 bytes, expected"),
])
def test_bad_image_structs_raise_image_errors(photo, change, message):
    with pytest.raises(ImageError, match=message):
        image_struct_to_rgb({**_struct(photo), **change})


def test_is_image_struct():
    assert is_image_struct(["origin", "height", "width", "nChannels", "mode", "data"])
    assert not is_image_struct(["path", "content"])


def test_named_layer_embedding_is_the_spatial_mean_of_its_output():
    torch.manual_seed(0)
    model = DigitsCNN().eval()
    x = torch.randn(3, 3, 32, 32)
    with torch.inference_mode():
        out = Predictor(model, top_k=2, embeddings=True, embedding_layer="features").predict(x)
        expected = model.features(x).mean(dim=(2, 3))
        default = Predictor(model, top_k=2, embeddings=True).predict(x)["embedding"]
    torch.testing.assert_close(out["embedding"], expected)
    assert out["embedding"].shape == (3, 32) and default.shape == (3, 64)  # the last Linear's input: 64
    assert pool_spatial(torch.ones(2, 5)).shape == (2, 5)


def test_unknown_layer_lists_valid_names():
    with pytest.raises(ModelError, match=r"--layer nope: .*features, classifier .*features\.\d"):
        Predictor(DigitsCNN(), top_k=1, embeddings=True, embedding_layer="nope")


def test_layer_changes_the_endpoint_fingerprint():
    spec = ModelSpec(DIGITS_FACTORY)
    default = resolve_endpoint(spec, embeddings=True)
    layered = resolve_endpoint(spec, embeddings=True, embedding_layer="features.2")  # the first block's pooling
    assert layered.endpoint.fingerprint != default.endpoint.fingerprint
    assert layered.embedding_dim == 16 and default.embedding_dim == 64


@pytest.mark.parametrize("options, message", [
    ({"layer": "features"}, "needs embeddings"),
    ({"labels": []}, "labels is empty"),
    ({"device": "tpu"}, "--device tpu"),
    ({"batch_size": 0}, "--batch-size 0"),
])
def test_inference_options_reject_bad_values(options, message):
    with pytest.raises(ConfigError, match=message):
        InferenceOptions(ModelSpec(DIGITS_FACTORY), **options)


def test_keyword_options_are_checked_where_they_enter():
    opts = inference_options("resnet18", batch_size="auto", labels=["a"], precision="fp32")
    assert opts.batch_size is None and opts.labels == ("a",) and opts.model == ModelSpec("resnet18")
    with pytest.raises(ConfigError, match="unknown option.*bogus"):
        inference_options("resnet18", bogus=1)
    with pytest.raises(ConfigError, match="batch_size 'big'"):
        inference_options("resnet18", batch_size="big")
    with pytest.raises(ConfigError, match="output='scores'"):
        cnn_udf("resnet18", output="scores")
    with pytest.raises(ConfigError, match="output='embedding'"):
        cnn_udf("resnet18", output="top1", layer="layer4")


def test_classify_config_carries_its_inference_options():
    options = InferenceOptions(ModelSpec(DIGITS_FACTORY), embeddings=True, layer="features", top_k=2)
    assert ClassifyConfig("in", "out", options).inference is options
    with pytest.raises(ConfigError, match="inference must be InferenceOptions"):
        ClassifyConfig("in", "out", ModelSpec(DIGITS_FACTORY))


def _plan(label_names=None, logits=False) -> InferencePlan:
    endpoint = resolve_endpoint(ModelSpec(DIGITS_FACTORY), top_k=2, logits=logits).endpoint
    return InferencePlan(endpoint=endpoint, launch=LaunchOptions(app_id="a"), job_id="j", label_names=label_names)


def _assembled(label_names=None, logits=False) -> pa.RecordBatch:
    """Classify output rows of a 3-row batch whose middle row failed before sending, as stream.assemble makes them
    from one reply for rows c and a (in that order)."""
    schema = reply_schema(logits=logits)
    outputs = {"label": np.array([7, 3]), "score": np.array([0.8, 0.9], np.float32),
               "topk_label": np.array([[7, 2], [3, 1]]), "topk_score": np.array([[0.8, 0.2], [0.9, 0.1]], np.float32)}
    if logits:
        outputs["logits"] = np.arange(20, dtype=np.float32).reshape(2, 10)[::-1]
    pending = PendingBatch(pa.array(["a", "b", "c"]), failed={1: "cannot decode image"})
    return assemble(_plan(label_names, logits), pending, [([2, 0], reply_batch(outputs, None, schema))])


def test_assembled_rows_are_the_classify_output_one_per_input_row():
    rows = _assembled(("zero", "one", "two", "three", "four", "five", "six", "seven"))
    assert rows.schema.equals(output_schema())
    assert rows.column("path").to_pylist() == ["a", "b", "c"]
    assert rows.column("label_name").to_pylist() == ["three", None, "seven"]
    with pytest.raises(SidecarError, match="2 result rows for 3 input rows"):
        assemble(_plan(), PendingBatch(pa.array(["a", "b", "c"])), [([0, 2], failed_rows(["x", "y"], reply_schema()))])


def test_udf_frames_keep_one_row_per_input_and_errors_in_place():
    names = tuple(f"digit {i}" for i in range(10))
    top1 = output_frame(_assembled(names), "top1", names)
    assert list(top1.columns) == ["label", "label_name", "score", "error"]
    assert top1["label"].tolist() == [3, None, 7] and top1["label_name"].tolist() == ["digit 3", None, "digit 7"]
    assert top1["error"].tolist() == [None, "cannot decode image", None]

    topk = output_frame(_assembled(names), "topk", names)
    assert list(topk.columns) == ["topk", "error"] and topk["topk"][1] is None
    assert [(p["label"], p["label_name"]) for p in topk["topk"][2]] == [(7, "digit 7"), (2, "digit 2")]

    logits = output_frame(_assembled(logits=True), "logits", None)
    assert list(logits.columns) == ["logits", "error"] and logits["logits"][1] is None
    assert list(logits["logits"][2]) == list(range(10, 20))
    assert set(OUTPUT_TYPES) == {"top1", "topk", "logits", "embedding", "raw", "detections", "segments"}


def test_raw_rows_are_assembled_without_classes_and_become_the_udf_struct():
    endpoint = resolve_endpoint(ModelSpec(DIGITS_FACTORY), output_kind="raw").endpoint
    plan = InferencePlan(endpoint=endpoint, launch=LaunchOptions(app_id="a"), job_id="j")
    schema = reply_schema(output_kind="raw")
    values = np.arange(12, dtype=np.float32).reshape(2, 2, 3)
    pending = PendingBatch(pa.array(["a", "b", "c"]), failed={1: "cannot decode image"})
    rows = assemble(plan, pending, [([2, 0], reply_batch({"raw": values}, None, schema))])
    assert rows.schema.equals(output_schema(output_kind="raw"))
    assert rows.column("raw").to_pylist() == [values[1].ravel().tolist(), None, values[0].ravel().tolist()]
    frame = output_frame(rows, "raw", None)
    assert list(frame.columns) == ["raw", "shape", "error"] and frame["shape"][1] is None
    assert list(frame["shape"][0]) == [2, 3] and frame["error"].tolist() == [None, "cannot decode image", None]


def test_embed_command_flags_make_an_embedding_config():
    args = build_parser().parse_args(["embed", "in", "out", "--model", "resnet18", "--layer", "layer3"])
    config = classify_config(args, embed=True)
    options = config.inference
    assert options.embeddings and options.layer == "layer3" and not options.logits and options.labels is None
    with pytest.raises(SystemExit):
        build_parser().parse_args(["embed", "in", "out", "--labels", "x.txt"])  # classify-only flag


def test_embed_command_unknown_layer_is_one_line_before_spark(tmp_path, capsys):
    (tmp_path / "in").mkdir()
    code = main(["embed", str(tmp_path / "in"), str(tmp_path / "out"), "--model", DIGITS_FACTORY, "--layer", "nope"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1
    assert err.startswith("spark-cnn embed: error: --layer nope:") and "features" in err
    assert not (tmp_path / "out").exists()
