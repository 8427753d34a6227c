"""`spark-cnn to-petastorm`: write images as a Petastorm dataset that petastorm's readers open."""

from __future__ import annotations

import argparse

from spark_cnn.cli.classify import add_decode_limits, add_input_options, add_on_error
from spark_cnn.config import DEFAULT_ROW_GROUP_MB
from spark_cnn.formats.petastorm import DEFAULT_JPEG_QUALITY, WRITE_CODECS


def register(commands) -> None:
    parser = commands.add_parser("to-petastorm", help="write the images under INPUT as a Petastorm dataset")
    parser.add_argument("input", metavar="INPUT", help="image folder, Parquet table or Petastorm dataset")
    parser.add_argument("output", metavar="OUTPUT", help="the Petastorm dataset directory to write, path or URI")
    add_input_options(parser)
    parser.add_argument("--codec", default=WRITE_CODECS[0], choices=WRITE_CODECS,
                        help="how images are stored: png (lossless, default), jpeg, or ndarray (raw RGB arrays)")
    parser.add_argument("--jpeg-quality", type=int, default=DEFAULT_JPEG_QUALITY,
                        help=f"with --codec jpeg (default: {DEFAULT_JPEG_QUALITY})")
    parser.add_argument("--row-group-mb", type=int, default=DEFAULT_ROW_GROUP_MB,
                        help=f"Parquet row group size in MiB (default: {DEFAULT_ROW_GROUP_MB})")
    parser.add_argument("--master", help="Spark master URL (default: Spark's, local[*] outside spark-submit)")
    add_on_error(parser)
    add_decode_limits(parser)
    parser.add_argument("--overwrite", action="store_true", help="replace OUTPUT if it exists")
    parser.add_argument("--quiet", action="store_true", help="print nothing but errors")
    parser.set_defaults(run=run)


def petastorm_config(args: argparse.Namespace):
    """PetastormConfig from parsed flags: each fills the field of its flat name, as for classify."""
    from spark_cnn.cli.resolution import build, given
    from spark_cnn.config import PetastormConfig

    return build(PetastormConfig, given(args))


def run(args: argparse.Namespace) -> int:
    from spark_cnn.spark.petastorm_job import to_petastorm

    config = petastorm_config(args)
    summary = to_petastorm(config)
    if not config.quiet:
        print(f"images      {summary['images']}\nerrors      {summary['errors']}\n"
              f"fields      {', '.join(summary['fields'])} ({summary['codec']})\n"
              f"elapsed     {summary['elapsed_s']} s\noutput      {summary['output']}")
    return 0
