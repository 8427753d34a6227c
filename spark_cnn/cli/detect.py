"""`spark-cnn detect`: images in, one Parquet row `path, detections, error` per image out (boxes in the input
image's pixels). Classify's inputs, guard rails, run options, staging and summary; the job is classify's."""

from __future__ import annotations

import argparse
import functools

from spark_cnn.cli import classify
from spark_cnn.cli.resolution import Option, given

TASK = "detect"


def add_arguments(parser: argparse.ArgumentParser, *, from_preset: bool = False, task: str = TASK) -> None:
    classify.add_arguments(parser, from_preset=from_preset, command=task)


def register_task(commands, task: str, help_text: str, run) -> None:
    """The parser of a dense-output command (detect, segment): classify's options for `task`."""
    parser = commands.add_parser(task, help=help_text)
    add_arguments(parser, task=task)
    parser.set_defaults(run=run)


def register(commands) -> None:
    register_task(commands, TASK, "detect objects in every image under INPUT (boxes, labels, scores) into Parquet",
                  run)


@functools.cache
def option_table() -> dict[str, Option]:
    return classify.option_table(TASK)


def run(args: argparse.Namespace) -> int:
    from spark_cnn.spark.conf import submitted_conf

    return execute_task(classify.resolution.resolve(option_table(), flags=given(args), spark_conf=submitted_conf()),
                        TASK)


def execute(values: dict) -> int:
    return execute_task(values, TASK)


def execute_task(values: dict, task: str) -> int:
    """Run the job of `task` on resolved options and print its report."""
    from spark_cnn.spark.classify_job import run_job

    config = classify.config_from({**values, "task": task})
    summary = run_job(config)
    if not config.quiet:
        print(classify.report(summary))
    return 0
