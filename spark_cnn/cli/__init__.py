"""`spark-cnn`: the command line. The same code runs behind `spark-submit jobs/<job>.py`.

Each subcommand lives in its own module with a `register(commands)` function that adds its parser and sets
`run` to its handler. Every SparkCnnError ends the command with one line on stderr and exit status 2; nothing
else is printed.
"""

from __future__ import annotations

import argparse
import sys

from spark_cnn.cli import (
    bench,
    bench_compare,
    bench_decode,
    bench_scale,
    classify,
    demo,
    detect,
    doctor,
    embed,
    etl,
    perf,
    perf_validate,
    run,
    segment,
    submit,
    to_petastorm,
)
from spark_cnn.errors import SparkCnnError

EXIT_ERROR = 2

# In the order `spark-cnn --help` lists them.
COMMAND_MODULES = (classify, embed, detect, segment, etl, run, demo, bench, bench_compare, bench_decode, bench_scale,
                   perf, perf_validate, to_petastorm, submit, doctor)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="spark-cnn", description="Run CNN models over image datasets on Spark.")
    commands = parser.add_subparsers(dest="command", required=True)
    for module in COMMAND_MODULES:
        module.register(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    parsed, passed_on = submit.split_argv(sys.argv[1:] if argv is None else list(argv))
    args = build_parser().parse_args(parsed)
    if passed_on is not None:
        args.spark_submit_args = passed_on
    try:
        return args.run(args)
    except SparkCnnError as e:
        print(f"spark-cnn {args.command}: error: {e}", file=sys.stderr)
        return EXIT_ERROR
