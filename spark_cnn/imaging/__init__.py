"""Image decoding and preprocessing. Torch-free, so Spark tasks can import it cheaply."""

from spark_cnn.imaging.decode import decode_rgb
from spark_cnn.imaging.limits import DecodeOptions
from spark_cnn.imaging.preprocess import Preprocessing, preprocess_pixels

__all__ = ["DecodeOptions", "Preprocessing", "decode_rgb", "preprocess_pixels"]
