"""The decoder per file kind (scikit-image's data folder, scikit-learn's photos, generated files), its guard rails,
and reduced-DCT / simplejpeg decoding against Pillow's full decode within the documented tolerance."""

from __future__ import annotations

import functools
import io
import json
import time
import warnings
from dataclasses import asdict

import numpy as np
import pytest
from PIL import Image

from spark_cnn.errors import ConfigError, ImageError
from spark_cnn.imaging import decode as decode_module
from spark_cnn.imaging import fastjpeg, tiff
from spark_cnn.imaging.decode import dct_scale, decode_for_resize, decode_rgb
from spark_cnn.imaging.limits import DEFAULT_MAX_PIXELS, IMAGE_FORMATS, DecodeOptions, pillow_pixel_ceiling
from spark_cnn.imaging.preprocess import Preprocessing, preprocess_pixels
from spark_cnn.imaging.samples import large_photo_jpegs
from spark_cnn.sidecar.batch_decode import decode_on_host
from spark_cnn.task.protocol import options_from_json
from tests.sample_images import (
    CORPUS_MAX_FILE_BYTES,
    CORPUS_MAX_PIXELS,
    corpus_broken_files,
    png_bomb,
    skimage_data_files,
    sklearn_photo_files,
)
from tests.sample_images import encode as _encode
from tests.sample_images import sample_photo as _photo

PILLOW_FULL = DecodeOptions(reduced_dct=False, jpeg_decoder="pillow")
PILLOW_REDUCED = DecodeOptions(reduced_dct=True, jpeg_decoder="pillow")
FAST_REDUCED = DecodeOptions(reduced_dct=True, jpeg_decoder="simplejpeg")
PREP = Preprocessing()  # resize 256, crop 224
CORPUS_LIMITS = DecodeOptions(max_pixels=CORPUS_MAX_PIXELS, max_file_bytes=CORPUS_MAX_FILE_BYTES)
# Reduced-DCT decoding (headroom 2) against full decode, both then resized 256 / cropped 224, grey levels.
# Measured by `spark-cnn bench-decode` (docs/benchmarks.md): mean 0.21, p99 1, max 4 on the large photos.
# The bounds leave room for other builds and files without hiding a wrong geometry (resizing without the
# source box cost a mean of several grey levels on 2100x1401 photos while this was written).
MAX_MEAN_DIFF = 1.0
MAX_P99_DIFF = 6
MAX_ABS_DIFF = 24
# Above a 64 x 64 TIFF's pixels, below its bytes once its samples (float64, or 40 a pixel) are counted.
TIFF_MAX_PIXELS = 5000


@functools.cache
def _skimage() -> dict[str, bytes]:
    return skimage_data_files()


@functools.cache
def _large() -> tuple[bytes, ...]:
    return tuple(large_photo_jpegs(6))


def _rgb(data: bytes, options: DecodeOptions = PILLOW_FULL) -> np.ndarray:
    return np.asarray(decode_rgb(data, options))


# --- every real file kind ---------------------------------------------------------------------------------------

def test_every_real_corpus_file_decodes_to_rgb():
    files = {**_skimage(), **sklearn_photo_files()}
    assert len(files) >= 30  # the whole data folder, not a lucky few
    for name, data in files.items():
        pixels = preprocess_pixels(data, Preprocessing(), CORPUS_LIMITS)
        assert pixels.shape == (224, 224, 3), name


def test_grayscale_png_becomes_equal_channels():
    data = _skimage()["skimage/camera.png"]
    gray = np.asarray(Image.open(io.BytesIO(data)))
    assert np.array_equal(_rgb(data), np.repeat(gray[..., None], 3, axis=-1))


def test_rgba_png_is_composited_on_white():
    data = _skimage()["skimage/horse.png"]  # alpha 110, 217 and 255
    rgba = np.asarray(Image.open(io.BytesIO(data))).astype(float)
    alpha = rgba[..., 3:] / 255
    expected = rgba[..., :3] * alpha + 255 * (1 - alpha)
    assert np.abs(_rgb(data) - expected).max() <= 1


def test_multipage_tiff_gives_the_first_page():
    data = _skimage()["skimage/multipage.tif"]
    with Image.open(io.BytesIO(data)) as image:
        first = np.asarray(image.convert("RGB"))
        image.seek(1)
        second = np.asarray(image.convert("RGB"))
    assert not np.array_equal(first, second)
    assert np.array_equal(_rgb(data), first)


def test_animated_gif_gives_the_first_frame():
    data = _skimage()["skimage/no_time_for_that_tiny.gif"]
    with Image.open(io.BytesIO(data)) as image:
        assert image.n_frames == 24
        first = np.asarray(image.convert("RGB"))
    assert np.array_equal(_rgb(data), first)


@pytest.mark.skipif(not tiff.available(), reason="tifffile (the `tiff` extra) is not installed")
def test_planar_float_tiff_that_pillow_cannot_read_goes_through_tifffile():
    import tifffile

    data = _skimage()["skimage/multipage_rgb.tif"]
    with pytest.raises(Exception, match="cannot identify"):
        Image.open(io.BytesIO(data))
    first = tifffile.imread(io.BytesIO(data), key=0)  # (3, 10, 10) float64 in [0, 1], planar
    expected = np.round(np.moveaxis(first, 0, -1) * 255)
    assert np.abs(_rgb(data) - expected).max() <= 1


def test_tiff_fallback_checks_the_pixel_limit_from_the_header():
    data = _skimage()["skimage/multipage_rgb.tif"]
    with pytest.raises(ImageError, match="10x10 = 100 pixels, more than --max-pixels 99"):
        decode_rgb(data, DecodeOptions(max_pixels=99))


@pytest.mark.skipif(not tiff.available(), reason="tifffile (the `tiff` extra) is not installed")
@pytest.mark.parametrize("shape, dtype, photometric", [((64, 64), np.float64, "minisblack"),
                                                       ((64, 64, 40), np.uint8, "rgb")],  # RGB + 37 extra samples
                         ids=["float64", "40-samples-a-pixel"])
def test_a_compressed_tiff_whose_samples_outgrow_the_pixel_limit_is_refused_before_tifffile_decodes_it(
        monkeypatch, shape, dtype, photometric):
    import tifffile

    buffer = io.BytesIO()
    tifffile.imwrite(buffer, np.zeros(shape, dtype), compression="zlib", photometric=photometric)
    data = buffer.getvalue()
    with pytest.raises(Exception, match="cannot identify"):
        Image.open(io.BytesIO(data))  # Pillow refuses it: tifffile decodes it
    assert decode_rgb(data).size == (64, 64)  # within the default limits it decodes
    decoded = []
    real_asarray = tifffile.TiffPage.asarray
    monkeypatch.setattr(tifffile.TiffPage, "asarray",
                        lambda page, **kw: decoded.append(page) or real_asarray(page, **kw))
    # 64 x 64 = 4096 pixels pass --max-pixels; 8 or 40 bytes a pixel do not fit its 4 bytes a pixel.
    with pytest.raises(ImageError, match=r"image too large: TIFF page of shape \(64, 64.*more than --max-pixels "
                                         r"5000 x 4 bytes; raise --max-pixels or convert it to 8-bit RGB"):
        decode_rgb(data, DecodeOptions(max_pixels=TIFF_MAX_PIXELS))
    assert decoded == [], "tifffile decoded the samples before their size was checked"


# --- colour modes made here ---------------------------------------------------------------------------------------

def test_palette_with_transparency_is_white_where_transparent():
    palette = _photo().resize((64, 48)).convert("P", palette=Image.Palette.ADAPTIVE, colors=16)
    index = np.asarray(palette)[0, 0]
    data = _encode(palette, "PNG", transparency=int(index))
    assert Image.open(io.BytesIO(data)).mode == "P"
    rgb = _rgb(data)
    transparent = np.asarray(palette) == index
    assert transparent.any() and (~transparent).any()
    assert np.all(rgb[transparent] == 255)
    opaque = np.asarray(palette.convert("RGB"))
    assert np.array_equal(rgb[~transparent], opaque[~transparent])


def test_gray_with_alpha_is_composited_on_white():
    gray = np.full((8, 8), 100, np.uint8)
    alpha = np.zeros((8, 8), np.uint8)
    alpha[:, 4:] = 255
    data = _encode(Image.fromarray(np.stack([gray, alpha], -1), mode="LA"), "PNG")
    rgb = _rgb(data)
    assert np.all(rgb[:, :4] == 255) and np.all(rgb[:, 4:] == 100)


@pytest.mark.skipif(not fastjpeg.available(), reason="simplejpeg (the `fast-jpeg` extra) is not installed")
def test_cmyk_jpeg_matches_pillow_conversion():
    cmyk = _photo().convert("CMYK")
    data = _encode(cmyk, "JPEG", quality=95)
    expected = np.asarray(Image.open(io.BytesIO(data)).convert("RGB")).astype(int)
    # simplejpeg, even when asked for, leaves CMYK to Pillow
    for options in (PILLOW_FULL, DecodeOptions(reduced_dct=False, jpeg_decoder="simplejpeg")):
        assert np.array_equal(_rgb(data, options), expected)
    assert np.abs(expected - np.asarray(_photo(), dtype=int)).mean() < 5  # and it is the photo's colours


def _sixteen_bit_ramp() -> np.ndarray:
    return np.array([[0, 128, 129, 257, 32768, 65534, 65535, 40000]], dtype=np.uint16)


@pytest.mark.parametrize("fmt", ["PNG", "TIFF"])
def test_16_bit_grayscale_is_scaled_not_clipped(fmt):
    data = _encode(Image.fromarray(_sixteen_bit_ramp()), fmt)
    assert Image.open(io.BytesIO(data)).mode == "I;16"
    assert _rgb(data)[0, :, 0].tolist() == [0, 0, 1, 1, 128, 255, 255, 156]


def test_16_bit_big_endian_tiff_is_scaled():
    ramp = _sixteen_bit_ramp()
    data = _encode(Image.frombytes("I;16B", (ramp.shape[1], 1), ramp.astype(">u2").tobytes()), "TIFF")
    assert Image.open(io.BytesIO(data)).mode == "I;16B"
    assert _rgb(data)[0, :, 1].tolist() == [0, 0, 1, 1, 128, 255, 255, 156]


def test_32_bit_integer_and_float_tiffs():
    ints = Image.fromarray(np.array([[0, 257, 65535, 70000, -5]], dtype=np.int32), mode="I")
    assert _rgb(_encode(ints, "TIFF"))[0, :, 0].tolist() == [0, 1, 255, 255, 0]
    floats = Image.fromarray(np.array([[0.0, 0.5, 1.0, 1.5, -0.1]], dtype=np.float32), mode="F")
    assert _rgb(_encode(floats, "TIFF"))[0, :, 2].tolist() == [0, 128, 255, 255, 0]


# --- reduced-DCT decoding and the fast decoder ----------------------------------------------------------------

@pytest.mark.parametrize("size, target, headroom, scale", [
    ((640, 427), 256, 2, 1),     # too small to reduce
    ((1100, 734), 256, 1, 2),
    ((1100, 734), 256, 2, 1),
    ((3000, 2002), 256, 2, 2),   # 2002 / 4 = 500 < 512
    ((4000, 2669), 256, 2, 4),
    ((4000, 2669), 256, 1, 8),
    ((4000, 2669), None, 2, 1),  # no target: full size
])
def test_dct_scale_keeps_the_shorter_side_above_headroom_times_target(size, target, headroom, scale):
    assert dct_scale(*size, target, headroom) == scale
    if target and scale > 1:
        assert min(size) // scale >= target * headroom


def _diff_stats(options: DecodeOptions, files, prep: Preprocessing = PREP) -> tuple[float, float, int]:
    diffs = np.concatenate([np.abs(preprocess_pixels(d, prep, options).astype(int)
                                   - preprocess_pixels(d, prep, PILLOW_FULL).astype(int)).ravel() for d in files])
    return float(diffs.mean()), float(np.percentile(diffs, 99)), int(diffs.max())


def test_reduced_dct_decoding_stays_within_tolerance_of_full_decode():
    files = list(_large()) + [_skimage()["skimage/retina.jpg"]]
    for data in files:
        image, box = decode_for_resize(data, PILLOW_REDUCED, min_short_side=256)
        assert box is not None and image.size[0] < Image.open(io.BytesIO(data)).size[0]  # really reduced
    mean, p99, worst = _diff_stats(PILLOW_REDUCED, files)
    assert mean <= MAX_MEAN_DIFF and p99 <= MAX_P99_DIFF and worst <= MAX_ABS_DIFF, (mean, p99, worst)
    assert mean > 0  # the comparison sees the reduced decode, not the full one twice


@pytest.mark.parametrize("orientation", [3, 6, 8])
def test_reduced_decoding_of_exif_rotated_jpegs_keeps_the_geometry(orientation):
    stored = _photo().resize((2101, 1403), Image.BICUBIC)  # odd sizes: the decoded edge is a partial block
    exif = Image.Exif()
    exif[0x0112] = orientation
    data = _encode(stored, "JPEG", quality=90, exif=exif)
    mean, p99, worst = _diff_stats(PILLOW_REDUCED, [data])
    assert mean <= MAX_MEAN_DIFF and p99 <= MAX_P99_DIFF and worst <= MAX_ABS_DIFF, (mean, p99, worst)


def test_multi_picture_jpeg_gives_the_first_picture_reduced():
    first, second = _photo().resize((2100, 1401)), _photo("flower.jpg").resize((2100, 1401))
    data = _encode(first, "MPO", save_all=True, append_images=[second], quality=90)
    assert Image.open(io.BytesIO(data)).format == "MPO"
    image, box = decode_for_resize(data, DecodeOptions(), min_short_side=256)
    assert image.size == (1050, 701) and box == (0, 0, 1050.0, 700.5)
    mean, p99, worst = _diff_stats(DecodeOptions(), [data])
    assert mean <= MAX_MEAN_DIFF and p99 <= MAX_P99_DIFF and worst <= MAX_ABS_DIFF, (mean, p99, worst)
    only_first = _encode(first, "JPEG", quality=90)
    assert np.abs(preprocess_pixels(data, PREP).astype(int) - preprocess_pixels(only_first, PREP)).mean() < 0.5


@pytest.mark.skipif(not fastjpeg.available(), reason="simplejpeg (the `fast-jpeg` extra) is not installed")
def test_simplejpeg_path_is_used_and_matches_pillow(monkeypatch):
    calls = []
    real = fastjpeg.decode_scaled
    monkeypatch.setattr(fastjpeg, "decode_scaled", lambda *a: calls.append(a[-1]) or real(*a))
    files = list(_large()[:2]) + [_encode(_photo(), "JPEG", quality=90), _encode(_photo().convert("L"), "JPEG")]
    for data in files:
        for prep in (Preprocessing(), Preprocessing(resize=64, crop=64)):
            fast = preprocess_pixels(data, prep, FAST_REDUCED).astype(int)
            pillow = preprocess_pixels(data, prep, PILLOW_REDUCED).astype(int)
            assert np.abs(fast - pillow).max() <= 1  # both libjpeg-turbo: identical here, one level of slack
    assert len(calls) == 2 * len(files) and {1, 2, 8} <= set(calls)  # full, 1/2 and 1/8 scales all went fast
    mean, p99, worst = _diff_stats(FAST_REDUCED, _large()[:2])
    assert mean <= MAX_MEAN_DIFF and p99 <= MAX_P99_DIFF and worst <= MAX_ABS_DIFF


@pytest.mark.skipif(not fastjpeg.available(), reason="simplejpeg (the `fast-jpeg` extra) is not installed")
@pytest.mark.parametrize("pillow_has_turbo, uses_simplejpeg", [(True, False), (False, True)])
def test_auto_uses_simplejpeg_only_where_pillow_lacks_libjpeg_turbo(monkeypatch, pillow_has_turbo,
                                                                   uses_simplejpeg):
    calls = []
    real = fastjpeg.decode_scaled
    monkeypatch.setattr(fastjpeg, "decode_scaled", lambda *a: calls.append(a[-1]) or real(*a))
    monkeypatch.setattr(fastjpeg, "PILLOW_HAS_LIBJPEG_TURBO", pillow_has_turbo)
    preprocess_pixels(_large()[0], PREP, DecodeOptions())
    assert bool(calls) == uses_simplejpeg


def test_without_simplejpeg_auto_uses_pillow_and_simplejpeg_is_refused(monkeypatch):
    monkeypatch.setattr(fastjpeg, "simplejpeg", None)
    data = _large()[0]
    assert np.array_equal(preprocess_pixels(data, Preprocessing(), DecodeOptions()),
                          preprocess_pixels(data, Preprocessing(), PILLOW_REDUCED))
    with pytest.raises(ImageError, match="simplejpeg .* not installed"):
        preprocess_pixels(data, Preprocessing(), FAST_REDUCED)


@pytest.mark.skipif(not fastjpeg.available(), reason="simplejpeg (the `fast-jpeg` extra) is not installed")
def test_files_simplejpeg_rejects_fall_back_to_pillow(monkeypatch):
    def refuse(*args):
        raise ValueError("strict decoder refused it")

    monkeypatch.setattr(fastjpeg, "decode_scaled", refuse)
    data = _encode(_photo(), "JPEG")
    assert np.array_equal(_rgb(data, DecodeOptions(jpeg_decoder="simplejpeg")), _rgb(data))


# --- guard rails ------------------------------------------------------------------------------------------------

def _other_format(fmt: str) -> bytes:
    """A small picture saved by Pillow in `fmt`: a file Pillow could open, in a format we do not decode."""
    picture = Image.new("RGB", (40, 30), (200, 10, 10))
    return _encode(picture.convert("1") if fmt in ("XBM", "MSP") else picture, fmt)


@pytest.mark.parametrize("fmt", ["EPS", "PPM", "ICO", "PCX", "SGI", "QOI", "DDS", "JPEG2000", "XBM", "MSP", "ICNS",
                                 "DIB"])
def test_formats_outside_the_allow_list_are_refused_naming_the_format(fmt):
    data = _other_format(fmt)
    assert Image.open(io.BytesIO(data)).format == fmt, "Pillow itself would open it"
    for decode in (lambda: decode_rgb(data), lambda: preprocess_pixels(data, PREP)):
        with pytest.raises(ImageError, match=rf"^cannot decode image: the file is in the {fmt} format \(by its "
                                             rf"first bytes\); only JPEG, PNG, GIF, BMP, TIFF, WEBP images are"):
            decode()
    [error] = decode_on_host([data], PREP)[1]  # the sidecar's host decoding: the same error
    assert error.startswith(f"cannot decode image: the file is in the {fmt} format (by its first bytes)")


def test_an_eps_file_never_reaches_pillows_postscript_plugin(monkeypatch):
    """Pillow's EPS plugin hands the file to Ghostscript where it is installed: it must not even parse it."""
    from PIL import EpsImagePlugin

    parsed = []
    monkeypatch.setattr(EpsImagePlugin.EpsImageFile, "_open", lambda self: parsed.append(self) or 1 / 0)
    with pytest.raises(ImageError, match="in the EPS format"):
        decode_rgb(_other_format("EPS"))
    assert parsed == [], "the EPS plugin parsed the file"


def test_non_image_documents_are_refused_with_their_first_bytes():
    pdf = _encode(Image.new("RGB", (40, 30)), "PDF")
    with pytest.raises(ImageError, match=r"not an image format Pillow reads \(starts with b'%PDF-1\.4'\)"):
        decode_rgb(pdf)


@pytest.mark.parametrize("fmt", IMAGE_FORMATS)
def test_every_allowed_format_decodes(fmt):
    picture = Image.new("RGB", (40, 30), (200, 10, 10))
    assert Image.open(io.BytesIO(_encode(picture, fmt))).format == fmt
    rgb = _rgb(_encode(picture, fmt, **({"lossless": True} if fmt == "WEBP" else {})))
    assert rgb.shape == (30, 40, 3)
    assert np.abs(rgb.astype(int) - [200, 10, 10]).max() <= (8 if fmt == "JPEG" else 0)


@pytest.mark.parametrize("name, message", [
    ("broken/truncated.jpg", r"cannot decode image: OSError: image file is truncated"),
    ("broken/zero_bytes.jpg", r"^empty file \(0 bytes\)$"),
    ("broken/random_bytes.jpg", r"cannot decode image: UnidentifiedImageError: not an image format"),
    ("broken/text_named.jpg", r"not an image format Pillow reads \(starts with b'this is '\)"),
    ("broken/too_many_pixels.png", r"image too large: 2000x1600 = 3200000 pixels, more than --max-pixels 3000000"),
    ("broken/too_many_bytes.png", r"file too large: \d+ bytes, more than --max-file-bytes 1000000"),
])
@pytest.mark.parametrize("options", [CORPUS_LIMITS, DecodeOptions(max_pixels=CORPUS_MAX_PIXELS,
                                                                   max_file_bytes=CORPUS_MAX_FILE_BYTES,
                                                                   jpeg_decoder="pillow")])
def test_each_broken_corpus_file_gives_its_own_error(name, message, options):
    with pytest.raises(ImageError, match=message):
        preprocess_pixels(corpus_broken_files()[name], Preprocessing(), options)


def test_a_decompression_bomb_is_refused_from_its_header_without_decoding():
    bomb = png_bomb(12_000, 12_000)  # 144 MP of zeros in ~150 KB: over our default, under Pillow's hard limit
    assert len(bomb) < 1_000_000
    started = time.perf_counter()
    with pytest.raises(ImageError, match="12000x12000 = 144000000 pixels, more than --max-pixels 89478485"):
        preprocess_pixels(bomb, Preprocessing())
    assert time.perf_counter() - started < 0.5  # decoding 144 MP would take seconds and 144 MB


def test_pillows_own_bomb_error_becomes_an_image_error():
    with pytest.raises(ImageError, match="image too large: .*Pillow's own limit"):
        decode_rgb(png_bomb(15_000, 14_000))  # 210 MP: Pillow refuses it while opening


def test_max_pixels_above_pillows_warning_threshold_decodes_quietly():
    data = png_bomb(9_500, 9_500)  # 90.25 MP: above Pillow's 89.5 MP warning threshold
    options = DecodeOptions(max_pixels=100_000_000)
    with warnings.catch_warnings():
        warnings.simplefilter("error", Image.DecompressionBombWarning)
        pixels = preprocess_pixels(data, Preprocessing(resize=32, crop=32), options)
    assert pixels.shape == (32, 32, 3) and pixels.max() == 0
    with pytest.raises(ImageError, match="more than --max-pixels"):
        preprocess_pixels(data, Preprocessing(), DecodeOptions(max_pixels=90_000_000))


@pytest.mark.parametrize("kwargs, message", [
    ({"max_pixels": 0}, r"--max-pixels 0: expected a positive integer"),
    ({"max_file_bytes": -1}, r"--max-file-bytes -1: expected a positive integer"),
    ({"max_pixels": 10**10}, r"Pillow refuses images above \d+ pixels"),
    ({"max_file_bytes": 2**31}, r"a file must fit one sidecar message"),
    ({"jpeg_decoder": "nvjpeg"}, r"expected one of auto, pillow, simplejpeg"),
    ({"dct_headroom": 0}, r"--dct-headroom 0: expected a positive integer"),
])
def test_invalid_decode_options_raise_config_error(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        DecodeOptions(**kwargs)


def test_decode_options_round_trip_and_defaults():
    options = DecodeOptions(max_pixels=1000, max_file_bytes=2000, jpeg_decoder="pillow")
    wire = json.loads(json.dumps(asdict(options)))  # as they cross the socket in the HELLO
    assert options_from_json(DecodeOptions, wire, "decode") == options
    assert options_from_json(DecodeOptions, {}, "decode") == DecodeOptions()
    assert DecodeOptions().max_pixels == DEFAULT_MAX_PIXELS <= pillow_pixel_ceiling() // 2
    with pytest.raises(ConfigError, match="unknown decode option"):
        options_from_json(DecodeOptions, {"max_pixel": 3}, "decode")


def test_sidecar_host_decoding_uses_the_same_guard_rails():
    broken = corpus_broken_files()
    good = sklearn_photo_files()["sklearn/china.jpg"]
    images = [good, broken["broken/too_many_pixels.png"], broken["broken/too_many_bytes.png"], good]
    pixels, errors = decode_on_host(images, Preprocessing(), CORPUS_LIMITS)
    assert pixels.shape == (2, 224, 224, 3)
    assert errors[0] is None and errors[3] is None
    assert errors[1].startswith("image too large") and errors[2].startswith("file too large")
    assert np.array_equal(pixels[0], preprocess_pixels(good, Preprocessing(), CORPUS_LIMITS))


def test_unexpected_errors_inside_the_decoder_become_image_errors(monkeypatch):
    def explode(image):
        raise MemoryError("no room")

    monkeypatch.setattr(decode_module, "to_rgb", explode)
    with pytest.raises(ImageError, match="cannot decode image: MemoryError: no room"):
        decode_rgb(_encode(_photo(), "PNG"))
