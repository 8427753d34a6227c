"""`spark-cnn run conf/JOB.yaml [--flag ...]`: run the job a YAML preset names, with its options.

Flags after the preset override it, and are the job's own flags (INPUT and OUTPUT too, when the preset leaves
them out): `spark-cnn run conf/etl-nightly.yaml --batch-size 32`.
"""

from __future__ import annotations

import argparse

from spark_cnn.cli import classify, detect, etl, resolution, segment, to_petastorm
from spark_cnn.errors import ConfigError

# The jobs a preset can name: each module has add_arguments(parser, from_preset=), option_table() and execute().
JOBS = {"classify": classify, "detect": detect, "etl": etl, "segment": segment, "to-petastorm": to_petastorm}


def register(commands) -> None:
    parser = commands.add_parser("run", help="run a YAML job preset (conf/*.yaml); flags after it override it")
    parser.add_argument("preset", metavar="PRESET.yaml",
                        help="job preset: `job: classify|detect|segment|etl|to-petastorm` and its options")
    parser.add_argument("overrides", nargs=argparse.REMAINDER, metavar="...",
                        help="the job's own flags, over the preset's values")
    parser.set_defaults(run=run)


def resolve_preset(path: str, overrides: list[str], spark_conf: dict | None) -> tuple[str, dict]:
    """(job, resolved options) for a preset file and the flags given after it."""
    from spark_cnn.cli.presets import load_preset

    job_name, preset = load_preset(path)
    job = JOBS.get(job_name)
    if job is None:
        raise ConfigError(f"preset {path}: unknown job {job_name!r}; valid jobs: {', '.join(sorted(JOBS))}")
    parser = argparse.ArgumentParser(prog=f"spark-cnn run {path}", description=f"overrides for the {job_name} job")
    job.add_arguments(parser, from_preset=True)
    flags = resolution.given(parser.parse_args(overrides))
    if job is to_petastorm and spark_conf:
        spark_conf = to_petastorm.own_settings(spark_conf)
    values = resolution.resolve(job.option_table(), flags=flags, preset=preset, preset_name=path, spark_conf=spark_conf)
    missing = [name.upper() for name in ("input", "output") if not values.get(name)]
    if missing:
        raise ConfigError(f"preset {path} gives no {' or '.join(missing)}: add `{missing[0].lower()}: ...` to it "
                          f"or pass it after the preset")
    return job_name, values


def run(args: argparse.Namespace) -> int:
    from spark_cnn.spark.conf import submitted_conf

    job_name, values = resolve_preset(args.preset, args.overrides, submitted_conf())
    return JOBS[job_name].execute(values)
