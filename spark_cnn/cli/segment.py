"""`spark-cnn segment`: images in, one Parquet row `path, mask, classes, error` per image out (a PNG of class
indices at the input image's size). Classify's inputs, guard rails, run options, staging and summary."""

from __future__ import annotations

import argparse
import functools

from spark_cnn.cli import classify, detect
from spark_cnn.cli.resolution import Option, given

TASK = "segment"


def add_arguments(parser: argparse.ArgumentParser, *, from_preset: bool = False) -> None:
    detect.add_arguments(parser, from_preset=from_preset, task=TASK)


def register(commands) -> None:
    detect.register_task(commands, TASK, "segment every image under INPUT (a class per pixel) into Parquet", run)


@functools.cache
def option_table() -> dict[str, Option]:
    return classify.option_table(TASK)


def run(args: argparse.Namespace) -> int:
    from spark_cnn.spark.conf import submitted_conf

    return execute(classify.resolution.resolve(option_table(), flags=given(args), spark_conf=submitted_conf()))


def execute(values: dict) -> int:
    return detect.execute_task(values, TASK)
