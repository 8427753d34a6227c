"""`spark-cnn etl`: classify only the images that arrived under INPUT since the last run; append them to OUTPUT."""

from __future__ import annotations

import argparse
import functools

from spark_cnn.cli import classify, flags, resolution
from spark_cnn.cli.resolution import Option, given


def add_arguments(parser: argparse.ArgumentParser, *, from_preset: bool = False) -> None:
    """classify's options and the incremental ones, generated from ClassifyConfig and EtlConfig."""
    flags.add_options(parser, option_table(), from_preset=from_preset)


def register(commands) -> None:
    parser = commands.add_parser("etl", help="classify the images new under INPUT since the last run (cron, Airflow)")
    add_arguments(parser)
    parser.set_defaults(run=run)


@functools.cache
def option_table() -> dict[str, Option]:
    from spark_cnn.config import ClassifyConfig, EtlConfig

    return resolution.option_table(ClassifyConfig, EtlConfig, command="etl")


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
