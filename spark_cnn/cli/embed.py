"""`spark-cnn embed`: images in, one Parquet row `path, embedding, error` per image out."""

from __future__ import annotations

import argparse

from spark_cnn.cli.classify import add_arguments, classify_config, report


def register(commands) -> None:
    parser = commands.add_parser("embed", help="embed every image under INPUT (one vector per image) into Parquet")
    add_arguments(parser, command="embed")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from spark_cnn.spark.classify_job import embed
    from spark_cnn.spark.conf import submitted_conf

    config = classify_config(args, embed=True, spark_conf=submitted_conf())
    summary = embed(config)
    if not config.quiet:
        print(report(summary))
    return 0
