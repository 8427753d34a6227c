"""`spark-cnn to-petastorm`: write images as a Petastorm dataset that petastorm's readers open."""

from __future__ import annotations

import argparse

from spark_cnn.cli.classify import add_input_options, input_options


def register(commands) -> None:
    parser = commands.add_parser("to-petastorm", help="write the images under INPUT as a Petastorm dataset")
    parser.add_argument("input", metavar="INPUT", help="image folder, Parquet table or Petastorm dataset")
    parser.add_argument("output", metavar="OUTPUT", help="the Petastorm dataset directory to write, path or URI")
    add_input_options(parser)
    parser.add_argument("--codec", default="png", choices=["png", "jpeg", "ndarray"],
                        help="how images are stored: png (lossless, default), jpeg, or ndarray (raw RGB arrays)")
    parser.add_argument("--jpeg-quality", type=int, default=95, help="with --codec jpeg (default: 95)")
    parser.add_argument("--row-group-mb", type=int, default=64, help="Parquet row group size in MiB (default: 64)")
    parser.add_argument("--master", help="Spark master URL (default: Spark's, local[*] outside spark-submit)")
    parser.add_argument("--on-error", default="record", choices=["record", "fail"],
                        help="an unreadable image: keep its row with `error` set, or fail the job")
    parser.add_argument("--overwrite", action="store_true", help="replace OUTPUT if it exists")
    parser.add_argument("--quiet", action="store_true", help="print nothing but errors")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from spark_cnn.config import PetastormConfig
    from spark_cnn.spark.petastorm_job import to_petastorm

    config = PetastormConfig(args.input, args.output, inputs=input_options(args), codec=args.codec,
                             jpeg_quality=args.jpeg_quality, row_group_mb=args.row_group_mb, master=args.master,
                             on_error=args.on_error, overwrite=args.overwrite, quiet=args.quiet)
    summary = to_petastorm(config)
    if not config.quiet:
        print(f"images      {summary['images']}\nerrors      {summary['errors']}\n"
              f"fields      {', '.join(summary['fields'])} ({summary['codec']})\n"
              f"elapsed     {summary['elapsed_s']} s\noutput      {summary['output']}")
    return 0
