"""Image decoding and preprocessing. Torch-free, so Spark tasks can import it cheaply."""

from spark_cnn.imaging.preprocess import Preprocessing, preprocess_pixels

__all__ = ["Preprocessing", "preprocess_pixels"]
