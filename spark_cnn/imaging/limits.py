"""How images are decoded, and the guard rails every file passes before its pixels are decoded.

The limits protect the processes that decode (Spark tasks and the sidecar): a file is refused with an
ImageError, which becomes that row's `error`, instead of exhausting memory or reaching a decoder outside
IMAGE_FORMATS. `--max-file-bytes` is checked
before any parsing, `--max-pixels` on the image header, before a single pixel is decoded; for a TIFF that
tifffile decodes, also the bytes of its samples (`MAX_BYTES_PER_PIXEL`).
"""

from __future__ import annotations

from dataclasses import dataclass

from PIL import Image

from spark_cnn.errors import ConfigError
from spark_cnn.options import option

# Pillow warns (DecompressionBombWarning) above this many pixels, and refuses twice as many: 89.5 MP, a
# quarter GiB of 8-bit RGB. Keeping our default at Pillow's warning threshold bounds one decoded image to
# 256 MiB per decoding process and keeps Pillow quiet on every image we accept.
DEFAULT_MAX_PIXELS = 89_478_485
# Pillow holds every mode it decodes in at most 4 bytes a pixel (RGBA, I, F), so --max-pixels bounds its memory
# to 4 bytes a pixel. TIFFs tifffile decodes get the same budget, whatever their samples: 40 samples a pixel or
# float64 pass the width x height check but would take 40 or 8 bytes a pixel. Such a page is refused from its
# header; float64 RGB (24 bytes a pixel) decodes up to a sixth of --max-pixels.
MAX_BYTES_PER_PIXEL = 4
# 64 MiB: well above compressed photos of up to the pixel limit; sixteen such files (one sidecar request of
# DEFAULT_REQUEST_ROWS) still fit the protocol's 1 GiB message. Uncompressed TIFFs near the pixel limit
# need it raised.
DEFAULT_MAX_FILE_BYTES = 64 * 1024 * 1024
# A single file must fit one sidecar message (protocol.MAX_PAYLOAD_BYTES = 1 GiB) with room to spare.
MAX_FILE_BYTES_CEILING = 512 * 1024 * 1024
JPEG_DECODERS = ("auto", "pillow", "simplejpeg")
# The limits are the sidecar's in a job (DecodeOptions travel in the HELLO); to-petastorm has no sidecar: its tasks.
NO_SIDECAR = (("to-petastorm", "tasks"),)
# The image formats decoded, as Pillow names them (MPO, the multi-picture JPEG, opens as JPEG). Pillow knows
# some forty; the others are refused before any of their code parses a byte: EPS runs Ghostscript where it is
# installed, and most bring parsers that see little use or fuzzing. Each is an error row naming its format.
IMAGE_FORMATS = ("JPEG", "PNG", "GIF", "BMP", "TIFF", "WEBP")
# Reduced DCT decoding keeps the decoded shorter side >= this many times the resize target, so the antialiased
# resize after it still averages >= 2 pixels per output pixel: within a fraction of a grey level of a full
# decode at about 3x its speed (`spark-cnn bench-decode`, docs/benchmarks.md "Reading side").
DEFAULT_DCT_HEADROOM = 2


def pillow_pixel_ceiling() -> int | None:
    """The most pixels Pillow opens at all (2 x Image.MAX_IMAGE_PIXELS); None if a user switched it off."""
    return None if Image.MAX_IMAGE_PIXELS is None else 2 * Image.MAX_IMAGE_PIXELS


@dataclass(frozen=True)
class DecodeOptions:
    """Guard rails and decoder choices, the same in Spark tasks and in the sidecar.

    max_pixels: images with more pixels (width x height, from the header) are refused before decoding, and so
    are TIFFs whose samples would take more than max_pixels x MAX_BYTES_PER_PIXEL bytes decoded.
    max_file_bytes: larger files are refused before they are parsed.
    reduced_dct: decode JPEGs at 1/2, 1/4 or 1/8 scale when the shorter side stays >= dct_headroom x the
    resize target.
    jpeg_decoder: `auto` uses simplejpeg when installed and Pillow lacks libjpeg-turbo (imaging.fastjpeg says
    why), else Pillow; `pillow` or `simplejpeg` force one.

    >>> DecodeOptions(max_pixels=1_000_000).max_file_bytes == DEFAULT_MAX_FILE_BYTES
    True
    """

    max_pixels: int = option(DEFAULT_MAX_PIXELS, help="refuse images with more pixels, from the header, before "
                             "decoding (decompression bombs; the default is Pillow's own warning threshold)",
                             reaches="sidecar",
                             reaches_for=NO_SIDECAR, example="50000000")
    max_file_bytes: int = option(DEFAULT_MAX_FILE_BYTES, help="refuse larger files before parsing them",
                                 default_text=f"{DEFAULT_MAX_FILE_BYTES} (64 MiB)", reaches="sidecar",
                                 reaches_for=NO_SIDECAR, example="16777216")
    reduced_dct: bool = True
    jpeg_decoder: str = "auto"
    dct_headroom: int = DEFAULT_DCT_HEADROOM

    def __post_init__(self) -> None:
        for name in ("max_pixels", "max_file_bytes", "dct_headroom"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"--{name.replace('_', '-')} {value}: expected a positive integer")
        ceiling = pillow_pixel_ceiling()
        if ceiling is not None and self.max_pixels > ceiling:
            raise ConfigError(f"--max-pixels {self.max_pixels}: Pillow refuses images above {ceiling} pixels as "
                              f"decompression bombs; give at most {ceiling}")
        if self.max_file_bytes > MAX_FILE_BYTES_CEILING:
            raise ConfigError(f"--max-file-bytes {self.max_file_bytes}: a file must fit one sidecar message; "
                              f"give at most {MAX_FILE_BYTES_CEILING}")
        if self.jpeg_decoder not in JPEG_DECODERS:
            raise ConfigError(f"JPEG decoder {self.jpeg_decoder!r}: expected one of {', '.join(JPEG_DECODERS)}")


DEFAULT_DECODE = DecodeOptions()
