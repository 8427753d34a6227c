"""Image file bytes -> an upright 8-bit RGB image, behind the guard rails, as fast as the target size allows.

Order of work, cheapest refusal first: empty file, file size, then the header (format and size, read by
Pillow without decoding pixels; only the formats in `limits.IMAGE_FORMATS` are tried, any other is an
ImageError naming it) against the pixel limit, then the pixels of the first frame only (multi-page TIFF,
animated GIF/PNG/WebP). Large JPEGs decode at 1/2, 1/4 or 1/8 scale in the DCT (libjpeg's scaled decoding,
through Pillow's `draft` or, when chosen, simplejpeg), choosing the largest scale that keeps the decoded
shorter side >= `DecodeOptions.dct_headroom` (2) x the size the caller will resize to. EXIF orientation is
applied; every mode becomes RGB as imaging.modes describes.
"""

from __future__ import annotations

import contextlib
import io
import os
import stat
import warnings

from PIL import Image, UnidentifiedImageError

from spark_cnn.errors import ImageError
from spark_cnn.imaging import fastjpeg, tiff
from spark_cnn.imaging.limits import DEFAULT_DECODE, IMAGE_FORMATS, MAX_BYTES_PER_PIXEL, DecodeOptions
from spark_cnn.imaging.modes import to_rgb

EXIF_ORIENTATION = 0x0112
# EXIF orientation -> the transpose that makes the image upright (as ImageOps.exif_transpose does).
UPRIGHT = {2: Image.Transpose.FLIP_LEFT_RIGHT, 3: Image.Transpose.ROTATE_180, 4: Image.Transpose.FLIP_TOP_BOTTOM,
           5: Image.Transpose.TRANSPOSE, 6: Image.Transpose.ROTATE_270, 7: Image.Transpose.TRANSVERSE,
           8: Image.Transpose.ROTATE_90}
TRANSPOSING = (5, 6, 7, 8)  # orientations whose upright picture swaps width and height
DCT_SCALES = (8, 4, 2)  # the power-of-two reductions libjpeg offers (Pillow's draft takes only these)
JPEG_FORMATS = ("JPEG", "MPO")  # MPO: the multi-picture JPEGs some cameras write; the first picture is a JPEG
FAST_JPEG_MODES = ("RGB", "L")  # CMYK/YCCK JPEGs go through Pillow, which undoes Adobe's inversion


def dct_scale(width: int, height: int, min_short_side: int | None, headroom: int = 1) -> int:
    """The largest of 8, 4, 2 by which the image can shrink with its shorter side still >= `headroom` x
    `min_short_side`; 1 when none can (or no target is given)."""
    if not min_short_side:
        return 1
    short = min(width, height)
    return next((s for s in DCT_SCALES if short >= min_short_side * headroom * s), 1)


def decode_rgb(data: bytes, options: DecodeOptions = DEFAULT_DECODE, *,
               min_short_side: int | None = None) -> Image.Image:
    """Decode image bytes to an upright RGB PIL image. Raises ImageError, saying why, for any file it refuses.

    min_short_side: the shorter side the caller needs (the resize target); JPEGs may then decode smaller
    (when `options.reduced_dct` allows), and the result may carry a margin: see `decode_for_resize`.
    """
    image, box = decode_for_resize(data, options, min_short_side=min_short_side)
    return image if box is None or box == (0, 0, *image.size) else image.crop(tuple(round(v) for v in box))


def decode_sized(data: bytes, options: DecodeOptions = DEFAULT_DECODE, *, min_short_side: int | None = None
                 ) -> tuple[Image.Image, tuple[float, ...] | None, tuple[int, int]]:
    """`decode_for_resize`, plus the upright picture's full (width, height): what a reduced-scale decode no
    longer shows, and what output coordinates (boxes, masks) refer to."""
    return _decode(data, options, min_short_side)


def decode_for_resize(data: bytes, options: DecodeOptions = DEFAULT_DECODE, *,
                      min_short_side: int | None = None) -> tuple[Image.Image, tuple[float, ...] | None]:
    """Like decode_rgb, plus the box (left, top, right, bottom, in the returned image's pixels) that holds the
    whole picture, or None when that is the whole image.

    A JPEG decoded at 1/s scale has ceil(size / s) pixels per side, and its last row and column stand for
    less than s source pixels; resizing from the box (`Image.resize(..., box=)`) keeps the geometry of a
    full decode exactly.
    """
    image, box, _ = _decode(data, options, min_short_side)
    return image, box


def _decode(data: bytes, options: DecodeOptions, min_short_side: int | None
            ) -> tuple[Image.Image, tuple[float, ...] | None, tuple[int, int]]:
    check_file_size(data, options)
    try:
        with _quiet_pillow_bomb_warning():
            image = Image.open(io.BytesIO(data), formats=IMAGE_FORMATS)
    except UnidentifiedImageError as e:
        if tiff.is_tiff(data) and tiff.available():
            tiff_image = _decode_tiff_fallback(data, options)
            return tiff_image, None, tiff_image.size
        refused = refused_format(data)
        if refused:
            raise ImageError(f"cannot decode image: the file is in the {refused} format (by its first bytes); only "
                             f"{', '.join(IMAGE_FORMATS)} images are decoded (convert it to one of them)") from e
        raise ImageError(f"cannot decode image: UnidentifiedImageError: not an image format Pillow reads "
                         f"(starts with {data[:8]!r})") from e
    except Image.DecompressionBombError as e:
        raise ImageError(f"image too large: {e} (Pillow's own limit)") from e
    except Exception as e:  # Pillow raises many unrelated types for bad headers
        raise ImageError(f"cannot decode image: {type(e).__name__}: {e}") from e
    check_pixels(*image.size, options)
    try:
        return _decode_pixels(data, image, options, min_short_side)
    except ImageError:
        raise
    except Exception as e:  # truncated data, corrupt streams, unsupported modes
        raise ImageError(f"cannot decode image: {type(e).__name__}: {e}") from e


def refused_format(data: bytes) -> str | None:
    """The Pillow format outside IMAGE_FORMATS that `data` would open as, judged from its first bytes as Pillow
    itself does (no plugin parses the file); None when no such format claims it."""
    prefix = data[:16]  # what Image.open passes to each format's check
    Image.init()
    if any(_claims(Image.OPEN[fmt][1], prefix) for fmt in IMAGE_FORMATS if fmt in Image.OPEN):
        return None  # a damaged file of a format we decode, not another format
    return next((fmt for fmt, (_, accept) in Image.OPEN.items()
                 if fmt not in IMAGE_FORMATS and _claims(accept, prefix)), None)


def _claims(accept, prefix: bytes) -> bool:
    try:
        return accept is not None and bool(accept(prefix))
    except Exception:  # a format's check that trips on short input claims nothing
        return False


def check_file_size(data: bytes, options: DecodeOptions = DEFAULT_DECODE) -> None:
    """Refuse empty files and files over `options.max_file_bytes`, before any parsing."""
    if not data:
        raise ImageError("empty file (0 bytes)")
    check_size(len(data), options)


def check_size(size: int, options: DecodeOptions = DEFAULT_DECODE) -> None:
    """Refuse a file of `size` bytes over `options.max_file_bytes`, before reading it (e.g. from a listing)."""
    if size > options.max_file_bytes:
        raise ImageError(f"file too large: {size} bytes, more than --max-file-bytes {options.max_file_bytes}")


def read_image_file(path: str, options: DecodeOptions = DEFAULT_DECODE) -> bytes:
    """The bytes of a local image file; an empty, oversized (checked before reading), unreadable or not regular
    file (a FIFO, a device, a socket, or a link to one) raises ImageError, so it costs its row only.

    Links to regular files are read: users list them on purpose. The link is resolved first and the target
    opened with O_NOFOLLOW | O_NONBLOCK, then `fstat` must show a regular file: a FIFO never blocks the open, a
    device (`/dev/zero`) is never read, and a target swapped for a link after resolving is refused. At most
    `options.max_file_bytes` + 1 bytes are read, so a file that grows while read costs no more than that.
    """
    try:
        data = _read_regular_file(path, options)
    except OSError as e:
        raise ImageError(f"cannot read file: {type(e).__name__}: {e.strerror or e}") from e
    check_file_size(data, options)
    return data


# Read size after the first read (which asks for the size `fstat` gave, + 1 to see the end of the file).
READ_CHUNK_BYTES = 1 << 20
FILE_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
              (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISLNK, "a symbolic link"))


def _read_regular_file(path: str, options: DecodeOptions) -> bytes:
    # One lstat settles the usual case, a regular file that is no link: os.path.realpath walks the path in
    # Python, an lstat per component (2.5% of a task's samples in a mobilenet_v3_small job's profile).
    if stat.S_ISREG(os.lstat(path).st_mode):
        target = path
    else:
        target = os.path.realpath(path)
        _require_regular(os.stat(target).st_mode, path, target)  # a device or FIFO is not even opened
    # O_NOFOLLOW: a file swapped for a link since the check fails to open instead of being followed
    fd = os.open(target, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        info = os.fstat(fd)
        _require_regular(info.st_mode, path, target)  # swapped since the stat
        check_size(info.st_size, options)  # before reading a file too large to read
        os.set_blocking(fd, True)  # a regular file: a slow disk or network mount waits, it does not fail
        limit = options.max_file_bytes
        chunks, total, want = [], 0, min(info.st_size, limit) + 1
        while total <= limit:
            chunk = os.read(fd, min(want, limit + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
            want = READ_CHUNK_BYTES
    finally:
        os.close(fd)
    if total > limit:
        raise ImageError(f"file too large: it grew past --max-file-bytes {limit} while it was read")
    return b"".join(chunks)


def _require_regular(mode: int, path: str, target: str) -> None:
    if stat.S_ISREG(mode):
        return
    kind = next((name for test, name in FILE_KINDS if test(mode)), f"of type {stat.S_IFMT(mode):o}")
    where = "" if os.path.abspath(target) == os.path.abspath(path) else f" (a link to {target})"
    raise ImageError(f"not a regular file{where}: it is {kind}; only regular files are read as images (list "
                     "the image files themselves)")


def check_pixels(width: int, height: int, options: DecodeOptions = DEFAULT_DECODE) -> None:
    """Refuse images over `options.max_pixels` (decompression bombs), from their header size."""
    if width * height > options.max_pixels:
        raise ImageError(f"image too large: {width}x{height} = {width * height} pixels, more than --max-pixels "
                         f"{options.max_pixels}")


def _decode_pixels(data: bytes, image: Image.Image, options: DecodeOptions, min_short_side: int | None
                   ) -> tuple[Image.Image, tuple[float, ...] | None, tuple[int, int]]:
    width, height = image.size
    jpeg = image.format in JPEG_FORMATS
    orientation = _orientation(image) if jpeg else None  # JPEG's EXIF precedes its pixels
    scale = dct_scale(width, height, min_short_side, options.dct_headroom) if jpeg and options.reduced_dct else 1
    decoded = None
    if jpeg and image.mode in FAST_JPEG_MODES and _use_fast_jpeg(options):
        try:
            pixels = fastjpeg.decode_scaled(data, width, height, scale)
        except ValueError:  # strict libjpeg-turbo refused it: Pillow decides, as it does without simplejpeg
            pixels = None
        if pixels is not None:
            decoded = Image.fromarray(pixels)
    if decoded is None:
        if scale > 1:
            image.draft(image.mode, (width // scale, height // scale))
        with _quiet_pillow_bomb_warning():
            image.load()  # the first frame only: Pillow opens multi-frame files at frame 0
        decoded = image
        if orientation is None:
            orientation = _orientation(image)  # PNG and WebP may store EXIF after the pixels
    if decoded.size == (width, height):
        scale = 1  # the decoder did not scale (Pillow's draft declines some files)
    elif decoded.size != (-(-width // scale), -(-height // scale)):
        raise ImageError(f"cannot decode image: decoded {decoded.size}, expected {width}x{height} / {scale}")
    box = None if scale == 1 else _upright_box(decoded.size, (width / scale, height / scale), orientation)
    upright = decoded.transpose(UPRIGHT[orientation]) if orientation in UPRIGHT else decoded
    full = (height, width) if orientation in TRANSPOSING else (width, height)
    return to_rgb(upright), box, full


def _upright_box(decoded: tuple[int, int], picture: tuple[float, float], orientation: int
                 ) -> tuple[float, float, float, float]:
    """Where the picture (the top-left `picture` of the `decoded` pixels) lies once the image is transposed
    upright; the margin is the right and bottom edge before transposing."""
    (dw, dh), (pw, ph) = decoded, picture
    return {
        2: (dw - pw, 0, dw, ph),                # mirrored left-right
        3: (dw - pw, dh - ph, dw, dh),          # rotated 180
        4: (0, dh - ph, pw, dh),                # mirrored top-bottom
        5: (0, 0, ph, pw),                      # transposed
        6: (dh - ph, 0, dh, pw),                # rotated 270 (clockwise)
        7: (dh - ph, dw - pw, dh, dw),          # transverse
        8: (0, dw - pw, ph, dw),                # rotated 90
    }.get(orientation, (0, 0, pw, ph))


def _use_fast_jpeg(options: DecodeOptions) -> bool:
    if options.jpeg_decoder == "pillow":
        return False
    if options.jpeg_decoder == "simplejpeg":
        if not fastjpeg.available():
            raise ImageError("the simplejpeg decoder was asked for but is not installed (pip install simplejpeg)")
        return True
    return fastjpeg.preferred()


def _orientation(image: Image.Image) -> int:
    try:
        return int(image.getexif().get(EXIF_ORIENTATION, 1))
    except Exception:  # unreadable EXIF: keep the image as stored rather than refuse it
        return 1


def _decode_tiff_fallback(data: bytes, options: DecodeOptions) -> Image.Image:
    try:
        header = tiff.first_page_header(data)
    except Exception as e:
        raise ImageError(f"cannot decode image: TIFF header unreadable: {type(e).__name__}: {e}") from e
    check_pixels(header.width, header.height, options)
    check_tiff_samples(header, options)
    try:
        return Image.fromarray(tiff.first_page_rgb(data))
    except ImageError:
        raise
    except Exception as e:
        raise ImageError(f"cannot decode image: {type(e).__name__}: {e}") from e


def check_tiff_samples(header: tiff.PageHeader, options: DecodeOptions = DEFAULT_DECODE) -> None:
    """Refuse a TIFF page whose samples would take more memory decoded than --max-pixels allows any image
    (limits.MAX_BYTES_PER_PIXEL), from its header: many samples a pixel or 64-bit samples pass check_pixels."""
    budget = options.max_pixels * MAX_BYTES_PER_PIXEL
    if header.decoded_bytes > budget:
        raise ImageError(f"image too large: TIFF page of shape {header.shape} ({header.dtype} samples, chunks of "
                         f"{header.chunk_shape}) takes {header.decoded_bytes} bytes to decode, more than "
                         f"--max-pixels {options.max_pixels} x {MAX_BYTES_PER_PIXEL} bytes; raise --max-pixels or "
                         "convert it to 8-bit RGB")


@contextlib.contextmanager
def _quiet_pillow_bomb_warning():
    """Pillow warns while opening any image above its MAX_IMAGE_PIXELS; here `options.max_pixels` decides,
    right after the header is read, so the warning would only add noise to task and sidecar logs.

    (warnings.catch_warnings is process-wide: two threads interleaving here can at worst leave this one
    warning category ignored, which is what this function wants anyway.)"""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        yield
