"""`spark-cnn etl`: classify only the images that arrived under INPUT since the last run; append them to OUTPUT."""

from __future__ import annotations

import argparse
import functools

from spark_cnn.cli import classify, resolution
from spark_cnn.cli.resolution import Option, flags_only, given


def add_arguments(parser: argparse.ArgumentParser, *, from_preset: bool = False) -> None:
    from spark_cnn.config import (
        DEFAULT_MAX_BYTES_PER_TRIGGER,
        DEFAULT_MAX_FILES_PER_TRIGGER,
        DEFAULT_SETTLE_S,
        byte_size,
    )

    classify.add_arguments(parser, from_preset=from_preset)
    etl = parser.add_argument_group("incremental")
    # Not argparse-required: a preset or spark.cnn.checkpoint may give it; EtlConfig insists on it.
    etl.add_argument("--checkpoint", metavar="DIR",
                     help="where the stream remembers which images are done (keep it with OUTPUT; required)")
    etl.add_argument("--max-files-per-trigger", type=int, default=DEFAULT_MAX_FILES_PER_TRIGGER, metavar="N",
                     help="images per micro-batch: a killed run redoes at most one batch "
                          f"(default: {DEFAULT_MAX_FILES_PER_TRIGGER})")
    etl.add_argument("--max-bytes-per-trigger", type=byte_size, default=DEFAULT_MAX_BYTES_PER_TRIGGER, metavar="SIZE",
                     help="bytes of input per micro-batch, e.g. 2g: large photos end a batch before "
                          f"--max-files-per-trigger does (default: {DEFAULT_MAX_BYTES_PER_TRIGGER >> 30}g)")
    etl.add_argument("--settle-seconds", type=float, default=DEFAULT_SETTLE_S, metavar="S",
                     help="take a file only once nothing has changed it for S seconds, so a copy in progress "
                          f"waits for the next run; 0: take every file at once (default: {DEFAULT_SETTLE_S:g})")


def register(commands) -> None:
    parser = commands.add_parser("etl", help="classify the images new under INPUT since the last run (cron, Airflow)")
    add_arguments(parser)
    flags_only(parser)
    parser.set_defaults(run=run)


@functools.cache
def option_table() -> dict[str, Option]:
    from spark_cnn.config import ClassifyConfig, EtlConfig

    parser = argparse.ArgumentParser(add_help=False)
    add_arguments(parser)
    return resolution.option_table(parser, ClassifyConfig, EtlConfig)


def etl_config(values: dict):
    from spark_cnn.config import EtlConfig

    return classify.config_from(values, EtlConfig)


def run(args: argparse.Namespace) -> int:
    from spark_cnn.spark.conf import submitted_conf

    return execute(resolution.resolve(option_table(), flags=given(args), spark_conf=submitted_conf()))


def execute(values: dict) -> int:
    from spark_cnn.spark.etl_job import run_etl

    config = etl_config(values)
    summary = run_etl(config)
    if not config.classify.quiet:
        print(report(summary))
    return 0


def report(summary: dict) -> str:
    """After each run: what was new, how fast, which sidecars, where it went."""
    batches = summary["micro_batches"]
    rate = "n/a" if summary["images_per_s"] is None else summary["images_per_s"]
    return "\n".join([
        f"new images  {summary['images']}",
        f"errors      {summary['errors']}",
        *([f"isolated    {len(summary['isolated'])}  (their micro-batch kept failing and they failed alone: error "
           "rows, the run went on; see the summary)"] if summary.get("isolated") else []),
        f"images/s    {rate}  ({summary['elapsed_s']} s)",
        f"batches     {len(batches)}" + (f" ({', '.join(str(b['batch']) for b in batches)})" if batches else ""),
        *([f"waiting     {summary['waiting']}  (changed too recently: a later run takes them)"]
          if summary.get("waiting") else []),
        f"batch size  {summary['batch_size'] or 'auto'}",
        f"sidecars    {len(summary['sidecars'])}",
        *classify.sidecar_table(summary["sidecars"]),
        f"output      {summary['output']}",
        f"checkpoint  {summary['checkpoint']}",
    ])
