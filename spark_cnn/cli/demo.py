"""`spark-cnn demo`: scikit-learn's digits classified by a small CNN trained on the spot."""

from __future__ import annotations

import argparse
import os

from spark_cnn.cli.classify import report
from spark_cnn.paths import user_cache_dir

DEFAULT_DEMO_DIR = user_cache_dir("demo")


def register(commands) -> None:
    parser = commands.add_parser("demo", help="classify scikit-learn's digits with a small CNN trained on the spot")
    parser.add_argument("--workdir", default=DEFAULT_DEMO_DIR,
                        help=f"demo data and model (default: {DEFAULT_DEMO_DIR})")
    parser.add_argument("--output", help="Parquet output (default: WORKDIR/output)")
    parser.add_argument("--master", default="local[2]", help="Spark master URL (default: local[2])")
    parser.add_argument("--summary", help="also write the JSON summary here")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from spark_cnn.config import ClassifyConfig, InferenceOptions
    from spark_cnn.models.digits import DIGITS_FACTORY, prepare_demo
    from spark_cnn.models.spec import ModelSpec
    from spark_cnn.spark.classify_job import classify

    assets = prepare_demo(args.workdir)
    if assets.train_accuracy is not None:
        print(f"trained the digits CNN: held-out accuracy {assets.train_accuracy:.4f} -> {assets.weights}")
    config = ClassifyConfig(
        input=assets.images, output=args.output or os.path.join(args.workdir, "output"),
        inference=InferenceOptions(ModelSpec(DIGITS_FACTORY, weights=assets.weights), labels=assets.labels),
        master=args.master, summary=args.summary, overwrite=True)
    print(report(classify(config)))
    return 0
