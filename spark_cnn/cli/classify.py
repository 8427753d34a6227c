"""`spark-cnn classify`: images in, one Parquet row per image out."""

from __future__ import annotations

import argparse
import functools

from spark_cnn.cli import flags, resolution
from spark_cnn.cli.resolution import Option, given

COMMAND = "classify"


def add_arguments(parser: argparse.ArgumentParser, *, from_preset: bool = False, command: str = COMMAND) -> None:
    """INPUT, OUTPUT and every option of classify (or of `command`: embed, detect, segment), generated from their
    declarations in spark_cnn/config.py. From a preset, INPUT and OUTPUT may come from the file."""
    flags.add_options(parser, option_table(command), from_preset=from_preset)


def register(commands) -> None:
    parser = commands.add_parser("classify", help="classify every image under INPUT into Parquet at OUTPUT")
    add_arguments(parser)
    parser.set_defaults(run=run)


@functools.cache
def option_table(command: str = COMMAND) -> dict[str, Option]:
    """Every option of classify (or embed, detect, segment): ClassifyConfig's declared fields, nested ones too."""
    from spark_cnn.config import ClassifyConfig

    return resolution.option_table(ClassifyConfig, command=command)


def classify_config(args: argparse.Namespace, *, embed: bool = False, preset: dict | None = None,
                    preset_name: str = "preset", spark_conf: dict | None = None, task: str = COMMAND):
    """ClassifyConfig from parsed flags, over a preset, over spark.cnn.* settings, over defaults. `embed=True`:
    the embed command's options (no labels, top-k or extra columns; the embedding on, from `--layer`); `task`:
    detect's or segment's."""
    values = resolution.resolve(option_table("embed" if embed else task), flags=given(args), preset=preset,
                                preset_name=preset_name, spark_conf=spark_conf)
    if embed:
        values.update(embeddings=True, logits=False, labels=None, top_k=None)
    if task != COMMAND:
        values.update(task=task)
    return config_from(values)


def config_from(values: dict, config: type | None = None):
    """ClassifyConfig (or `config`, e.g. EtlConfig) from resolved option values: each value fills the field of its
    flat name, nested ones too; the model options become the ModelSpec (resolution.build)."""
    from spark_cnn.config import ClassifyConfig

    return resolution.build(config or ClassifyConfig, values)


def report(summary: dict) -> str:
    """The short table a person reads after a job: totals, then one line per sidecar, then where the output is."""
    accuracy = "n/a" if summary.get("accuracy") is None else f"{summary['accuracy']:.4f}"
    rate = "n/a" if summary["images_per_s"] is None else summary["images_per_s"]
    lines = [
        f"images      {summary['images']}",
        f"errors      {summary['errors']}",
        f"images/s    {rate}  ({summary['elapsed_s']} s)",
        f"batch size  {summary['batch_size'] or 'auto'}",
        f"accuracy    {accuracy}",
        f"sidecars    {len(summary['sidecars'])}",
        *sidecar_table(summary["sidecars"]),
        f"output      {summary['output']}",
    ]
    return "\n".join(lines)


def sidecar_table(sidecars: list[dict]) -> list[str]:
    """One indented line per sidecar: where it ran, what it served, how full its batches were."""
    if not sidecars:
        return []
    header = ("executor", "host", "pid", "device", "requests", "batches", "mean batch")
    rows = [tuple(str(s.get(k, "")) for k in ("executor", "host", "pid", "device", "requests", "batches",
                                              "mean_batch_size")) for s in sidecars]
    widths = [max(len(r[i]) for r in (header, *rows)) for i in range(len(header))]
    table = ["  " + "  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip()
             for r in (header, *rows)]
    # A sidecar whose batches disagreed with the device profile for long enough says so, and what it did.
    for s in sidecars:
        check = s.get("prediction") or {}
        if check.get("message"):
            action = f"; {check['action']}" if check.get("action") else ""
            table.append(f"  executor {s.get('executor')}: {check['message']}{action}")
    return table


def run(args: argparse.Namespace) -> int:
    from spark_cnn.spark.conf import submitted_conf

    return execute(resolution.resolve(option_table(), flags=given(args), spark_conf=submitted_conf()))


def execute(values: dict) -> int:
    """Run the classify job on resolved options and print its report."""
    from spark_cnn.spark.classify_job import classify

    config = config_from(values)
    summary = classify(config)
    if not config.quiet:
        print(report(summary))
    return 0
