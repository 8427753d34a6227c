"""`spark-cnn bench-scale`: planning, driver memory, steady rate, output files and the summary's cost at N files."""

from __future__ import annotations

import argparse


def register(commands) -> None:
    from spark_cnn.bench.scale import DEFAULT_FILES, QUICK_FILES

    parser = commands.add_parser("bench-scale", help="the framework's cost per file at big-data sizes (N small PNGs)")
    parser.add_argument("--files", type=int,
                        help=f"images to generate and classify (default {DEFAULT_FILES:,}, or {QUICK_FILES:,} with "
                             "--quick; cached per N)")
    parser.add_argument("--quick", action="store_true",
                        help=f"one classify run (of {QUICK_FILES:,} files unless --files says), no baseline run")
    parser.add_argument("--plan-only", action="store_true",
                        help="list and partition the files and run one Spark job over them, no inference: "
                             "planning time and driver memory at N in about a minute")
    parser.add_argument("--etl", action="store_true",
                        help="also one `spark-cnn etl` run over the same N new files, against classify's rate")
    parser.add_argument("--data-dir", help="where the generated images are cached (default ~/.cache/spark_cnn/bench)")
    parser.add_argument("--json", help="write the results here")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from spark_cnn.bench.scale import run_scale_bench, table
    from spark_cnn.cli.common import write_json

    report = run_scale_bench(scale_config(args))
    print()
    print(table(report))
    write_json(args.json, report)
    return 0


def scale_config(args: argparse.Namespace):
    """The ScaleConfig the flags ask for; a bad combination is one ConfigError line."""
    from spark_cnn.bench.scale import DEFAULT_FILES, QUICK_FILES, ScaleConfig
    from spark_cnn.errors import ConfigError

    if args.files is not None and args.files < 1:
        raise ConfigError(f"--files {args.files}: expected a positive number of files")
    if args.quick and args.plan_only:
        raise ConfigError("--quick and --plan-only: choose one (--quick classifies, --plan-only does not)")
    extra = {"data_dir": args.data_dir} if args.data_dir else {}
    return ScaleConfig(files=args.files or (QUICK_FILES if args.quick else DEFAULT_FILES), quick=args.quick,
                       plan_only=args.plan_only, etl=args.etl, **extra)
