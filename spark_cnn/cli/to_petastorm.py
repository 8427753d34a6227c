"""`spark-cnn to-petastorm`: write images as a Petastorm dataset that petastorm's readers open."""

from __future__ import annotations

import argparse
import functools

from spark_cnn.cli import flags, resolution
from spark_cnn.cli.resolution import Option, given

COMMAND = "to-petastorm"


def add_arguments(parser: argparse.ArgumentParser, *, from_preset: bool = False) -> None:
    """INPUT, OUTPUT and PetastormConfig's options, generated from their declarations."""
    flags.add_options(parser, option_table(), from_preset=from_preset)


def register(commands) -> None:
    parser = commands.add_parser(COMMAND, help="write the images under INPUT as a Petastorm dataset")
    add_arguments(parser)
    parser.set_defaults(run=run)


@functools.cache
def option_table() -> dict[str, Option]:
    from spark_cnn.config import PetastormConfig

    return resolution.option_table(PetastormConfig, command=COMMAND)


def petastorm_config(args: argparse.Namespace, *, preset: dict | None = None, preset_name: str = "preset",
                     spark_conf: dict | None = None):
    """PetastormConfig from parsed flags over a preset over spark.cnn.* settings, as for classify."""
    return config_from(resolution.resolve(option_table(), flags=given(args), preset=preset, preset_name=preset_name,
                                          spark_conf=spark_conf))


def config_from(values: dict):
    from spark_cnn.config import PetastormConfig

    return resolution.build(PetastormConfig, values)


def own_settings(spark_conf: dict) -> dict:
    """The spark.cnn.* settings of to-petastorm's options: a cluster's spark.cnn.batchSize and the like are the
    inference jobs' settings, not a mistake here (a spark.cnn.* key no job knows still is, in those jobs)."""
    keys = {option.conf_key for option in option_table().values()}
    return {key: value for key, value in spark_conf.items()
            if not key.startswith(resolution.SPARK_CONF_PREFIX) or key in keys}


def run(args: argparse.Namespace) -> int:
    from spark_cnn.spark.conf import submitted_conf

    return execute(resolution.resolve(option_table(), flags=given(args), spark_conf=own_settings(submitted_conf())))


def execute(values: dict) -> int:
    """Write the Petastorm dataset of resolved options and print its report."""
    from spark_cnn.spark.petastorm_job import to_petastorm

    config = config_from(values)
    summary = to_petastorm(config)
    if not config.quiet:
        print(f"images      {summary['images']}\nerrors      {summary['errors']}\n"
              f"fields      {', '.join(summary['fields'])} ({summary['codec']})\n"
              f"elapsed     {summary['elapsed_s']} s\noutput      {summary['output']}")
    return 0
