"""Pure format code: the Unischema pickle (both ways, and refusing anything else), petastorm metadata, decoded
pixels, input options and file-name globs. No Spark, no petastorm."""

from __future__ import annotations

import io
import json
import os
import pickle
import struct

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

from spark_cnn.config import ClassifyConfig, InferenceOptions, InputOptions, PetastormConfig
from spark_cnn.errors import ConfigError, ImageError, InputError
from spark_cnn.formats import petastorm
from spark_cnn.formats.unischema import (
    CompressedImageCodec,
    NdarrayCodec,
    ScalarCodec,
    Unischema,
    UnischemaField,
    dumps_unischema,
    loads_unischema,
    spark_type,
)
from spark_cnn.imaging.decode import decode_rgb
from spark_cnn.imaging.pixels import preprocess_rgb, rgb_from_array, rgb_from_npy, rgb_from_spark_image
from spark_cnn.imaging.preprocess import Preprocessing, preprocess_pixels
from spark_cnn.models.spec import ModelSpec
from spark_cnn.spark.sources import matches_glob

HERE = os.path.dirname(__file__)


def _petastorm_pickle() -> bytes:
    """The Unischema petastorm 0.13.1 itself stored (materialize_dataset; numpy 1.26, pyspark 3.5, Python 3.11):
    Unischema('ImgSchema', [UnischemaField('id', np.str_, (), ScalarCodec(StringType()), False),
        UnischemaField('label', np.int32, (), ScalarCodec(IntegerType()), False),
        UnischemaField('image', np.uint8, (None, None, 3), CompressedImageCodec('png'), False),
        UnischemaField('arr', np.uint8, (8, 8, 3), NdarrayCodec(), False)])"""
    with open(os.path.join(HERE, "data", "petastorm-0.13.1-unischema.pickle.hex")) as f:
        return bytes.fromhex(f.read())


def _image_schema() -> Unischema:
    string = ScalarCodec(spark_type("StringType"))
    return Unischema("Images", [
        UnischemaField("path", np.str_, (), string, False),
        UnischemaField("image", np.uint8, (None, None, 3), CompressedImageCodec("jpeg", 90), True),
        UnischemaField("pixels", np.uint8, (8, 8, 3), NdarrayCodec(), True),
        UnischemaField("label", np.int32, (), ScalarCodec(spark_type("IntegerType")), False)])


def test_unischema_round_trips_through_our_pickle():
    schema = _image_schema()
    back = loads_unischema(dumps_unischema(schema))
    assert back.name == "Images" and list(back.fields) == ["path", "image", "pixels", "label"]
    assert list(back.fields.values()) == list(schema.fields.values())
    assert back.fields["image"].codec == CompressedImageCodec("jpeg", 90)
    assert back.fields["label"].numpy_dtype is np.int32 and back.fields["image"].shape == (None, None, 3)


def test_a_unischema_petastorm_pickled_is_read_into_our_stand_ins():
    schema = loads_unischema(_petastorm_pickle())
    assert schema.name == "ImgSchema" and list(schema.fields) == ["id", "label", "image", "arr"]
    assert schema.fields["id"].codec == ScalarCodec(spark_type("StringType"))
    assert schema.fields["image"].codec == CompressedImageCodec("png", 80)
    assert schema.fields["arr"] == UnischemaField("arr", np.uint8, (8, 8, 3), NdarrayCodec(), False)
    assert petastorm.image_field(schema, "arr") == ("arr", "npy")
    with pytest.raises(ConfigError, match="2 image fields"):
        petastorm.image_field(schema)


class _RunsACommand:
    def __reduce__(self):
        return (os.system, ("echo this must never run",))


@pytest.mark.parametrize("payload", [
    pickle.dumps(_RunsACommand()),
    pickle.dumps(eval),  # a global outside the allow-list, even a builtin
    b"cbuiltins\nexec\n(Vprint(1)\ntR.",  # hand-made: exec a string
])
def test_a_malicious_pickle_is_refused_with_a_clear_error(payload):
    with pytest.raises(InputError, match=r"cannot be read safely: refusing to load (posix|nt|builtins)\.\w+"):
        loads_unischema(payload, source="file:/data/ds")


def _build_on_class(module: str, name: str, attribute: str, value: str) -> bytes:
    """A pickle that loads the allowed class `module.name` and BUILDs (None, {attribute: value}) on the class
    itself: the slots part of a BUILD state is set with setattr, on whatever object is below it."""
    def text(s: str) -> bytes:
        return b"X" + struct.pack("<I", len(s.encode())) + s.encode()

    return (b"\x80\x02c" + f"{module}\n{name}\n".encode() + b"N}" + text(attribute) + text(value)
            + b"s\x86b.")  # None, {attribute: value}, TUPLE2, BUILD, STOP


@pytest.mark.parametrize("module, name, attribute", [
    ("petastorm.codecs", "CompressedImageCodec", "image_codec"),
    ("petastorm.unischema", "Unischema", "__setstate__"),
    ("petastorm.unischema", "UnischemaField", "__eq__"),
    ("pyspark.sql.types", "StringType", "name"),
])
def test_a_pickle_that_would_patch_an_allowed_class_is_refused(module, name, attribute):
    from spark_cnn.formats.unischema import _ALLOWED

    cls = _ALLOWED[(module, name)]
    before = dict(vars(cls))
    try:
        with pytest.raises(InputError, match=rf"cannot be read safely: refusing to set state on the class "
                                             rf"[\w.]+\.{name}"):
            loads_unischema(_build_on_class(module, name, attribute, "patched"), source="file:/data/ds")
        assert dict(vars(cls)) == before, f"the pickle changed the class {name} for the whole process"
    finally:  # without the fix the class is patched: put it back so that other tests see the real one
        for key in set(vars(cls)) - set(before):
            delattr(cls, key)
        for key, value in before.items():
            if vars(cls).get(key) is not value and key not in ("__dict__", "__weakref__", "__doc__"):
                setattr(cls, key, value)


def test_state_on_objects_still_loads_after_refusing_it_on_classes():
    """The BUILDs petastorm writes (codec and schema state) are on objects: both pickles still load whole."""
    schema = loads_unischema(_petastorm_pickle())
    assert schema.fields["image"].codec.image_codec == "png"
    assert loads_unischema(dumps_unischema(_image_schema())).fields["image"].codec == CompressedImageCodec("jpeg", 90)


def test_a_pickle_of_something_else_or_garbage_is_refused():
    with pytest.raises(InputError, match="not a Unischema"):
        loads_unischema(pickle.dumps({"a": 1}))
    with pytest.raises(InputError, match="corrupt"):
        loads_unischema(dumps_unischema(_image_schema())[:40])


def test_common_metadata_holds_the_schema_and_row_groups():
    schema = petastorm.image_unischema("png", with_label=True)
    data = petastorm.common_metadata(schema, {"part-1.parquet": 2, "part-0.parquet": 1})
    metadata = pq.read_metadata(pa.BufferReader(data))
    assert metadata.schema.to_arrow_schema().names == ["path", "image", "label", "error"]
    assert json.loads(metadata.metadata[petastorm.ROW_GROUPS_PER_FILE_KEY]) == {"part-0.parquet": 1,
                                                                                 "part-1.parquet": 2}
    assert list(petastorm.read_unischema(data, source="x").fields) == ["path", "image", "label", "error"]
    with pytest.raises(InputError, match="holds no petastorm Unischema"):
        sink = pa.BufferOutputStream()
        pq.write_metadata(pa.schema([("a", pa.int32())]), sink)
        petastorm.read_unischema(sink.getvalue().to_pybytes(), source="x")


def test_encoded_images_decode_to_the_pixels_written():
    rgb = np.random.default_rng(0).integers(0, 256, (5, 7, 3), dtype=np.uint8)
    np.testing.assert_array_equal(np.asarray(Image.open(io.BytesIO(petastorm.encode_image(rgb, "png")))), rgb)
    np.testing.assert_array_equal(rgb_from_npy(petastorm.encode_image(rgb, "ndarray")), rgb)
    assert Image.open(io.BytesIO(petastorm.encode_image(rgb, "jpeg"))).format == "JPEG"


def test_spark_image_rows_are_bgr_and_become_rgb():
    rgb = np.random.default_rng(1).integers(0, 256, (4, 6, 3), dtype=np.uint8)
    bgr = rgb[:, :, ::-1].tobytes()
    np.testing.assert_array_equal(rgb_from_spark_image(bgr, 4, 6, 3), rgb)
    opaque = np.concatenate([rgb[:, :, ::-1], np.full((4, 6, 1), 255, np.uint8)], axis=2).tobytes()
    np.testing.assert_array_equal(rgb_from_spark_image(opaque, 4, 6, 4), rgb)
    # Translucent pixels are composited on white, as a decoded RGBA file is: same model input either way.
    rgba = np.concatenate([rgb, np.full((4, 6, 1), 7, np.uint8)], axis=2)
    png = io.BytesIO()
    Image.fromarray(rgba, mode="RGBA").save(png, format="PNG")
    bgra = rgba[:, :, [2, 1, 0, 3]].tobytes()
    np.testing.assert_array_equal(rgb_from_spark_image(bgra, 4, 6, 4), np.asarray(decode_rgb(png.getvalue())))
    gray = rgb[:, :, 0]
    np.testing.assert_array_equal(rgb_from_spark_image(gray.tobytes(), 4, 6, 1), np.stack([gray] * 3, axis=2))
    with pytest.raises(ImageError, match="could not decode"):
        rgb_from_spark_image(b"", -1, -1, -1)
    with pytest.raises(ImageError, match="expected 4x6x3"):
        rgb_from_spark_image(bgr[:-1], 4, 6, 3)


def test_npy_inputs_are_checked_and_never_unpickled():
    buffer = io.BytesIO()
    np.save(buffer, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(ImageError, match="cannot read the NumPy array"):
        rgb_from_npy(buffer.getvalue())
    with pytest.raises(ImageError, match="dtype float32"):
        rgb_from_array(np.zeros((4, 4, 3), np.float32))
    with pytest.raises(ImageError, match="shape"):
        rgb_from_array(np.zeros((4, 4, 2), np.uint8))


def test_decoded_pixels_get_the_same_resize_and_crop_as_files():
    rgb = np.random.default_rng(2).integers(0, 256, (37, 51, 3), dtype=np.uint8)
    png = io.BytesIO()
    Image.fromarray(rgb).save(png, format="PNG")
    prep = Preprocessing(resize=20, crop=16)
    np.testing.assert_array_equal(preprocess_rgb(rgb, prep), preprocess_pixels(png.getvalue(), prep))


def test_hadoop_style_globs():
    assert matches_glob("a.jpg", "*.jpg") and not matches_glob("a.jpeg", "*.jpg")
    assert matches_glob("a.png", "*.{jpg,png}") and not matches_glob("a.gif", "*.{jpg,png}")
    assert matches_glob("x1.JPG", "x?.[Jj]PG") and matches_glob("anything", None)


def test_input_and_partition_options_are_checked_before_any_work():
    with pytest.raises(ConfigError, match="--input-format tiff"):
        InputOptions(format="tiff")
    with pytest.raises(ConfigError, match="--image-column applies to parquet and petastorm"):
        InputOptions(format="images", image_column="img")
    with pytest.raises(ConfigError, match="--glob applies to image files"):
        InputOptions(format="parquet", glob="*.jpg")
    with pytest.raises(ConfigError, match="no '/'"):
        InputOptions(glob="a/*.jpg")
    with pytest.raises(ConfigError, match="--partition-by score"):
        ClassifyConfig("in", "out", InferenceOptions(ModelSpec("resnet18")), partition_by="score")
    with pytest.raises(ConfigError, match="--codec gif"):
        PetastormConfig("in", "out", codec="gif")


def test_cli_input_and_partition_flags_fill_the_config():
    from spark_cnn.cli import build_parser
    from spark_cnn.cli.classify import classify_config

    args = build_parser().parse_args(["classify", "t/", "out", "--input-format", "parquet", "--image-column", "jpg",
                                      "--path-column", "key", "--label-column", "cls", "--partition-by", "true_label"])
    config = classify_config(args)
    assert config.inputs == InputOptions(format="parquet", image_column="jpg", path_column="key", label_column="cls")
    assert config.partition_by == "true_label"
    assert classify_config(build_parser().parse_args(["classify", "i/", "o", "--glob", "*.jpg"])).inputs.glob == "*.jpg"


def test_cli_to_petastorm_refuses_bad_options_in_one_line(capsys):
    from spark_cnn.cli import main

    assert main(["to-petastorm", "in/", "out/", "--input-format", "image", "--label-column", "y"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "spark-cnn to-petastorm: error: --label-column applies to parquet and petastorm inputs, "
        "not --input-format image"]
    assert main(["to-petastorm", "in/", "out/", "--row-group-mb", "0"]) == 2
    assert "--row-group-mb 0" in capsys.readouterr().err
