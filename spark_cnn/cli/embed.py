"""`spark-cnn embed`: images in, one Parquet row `path, embedding, error` per image out."""

from __future__ import annotations

import argparse

from spark_cnn.cli.classify import add_classify_options, classify_config, report


def register(commands) -> None:
    parser = commands.add_parser("embed", help="embed every image under INPUT (one vector per image) into Parquet")
    parser.add_argument("input", metavar="INPUT", help="folder of images (searched recursively), path or URI")
    parser.add_argument("output", metavar="OUTPUT", help="Parquet output directory, path or URI")
    add_classify_options(parser, embed=True)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from spark_cnn.spark.classify_job import embed

    config = classify_config(args, embed=True)
    summary = embed(config)
    if not config.quiet:
        print(report(summary))
    return 0
