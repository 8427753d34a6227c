"""`spark-cnn bench-sidecar`: dynamic batching on vs off vs the device alone, without Spark."""

from __future__ import annotations

import argparse
import functools

from spark_cnn.cli import flags, resolution
from spark_cnn.cli.common import write_json

COMMAND = "bench-sidecar"


@functools.cache
def option_table() -> dict:
    """bench-sidecar's options, from SidecarBenchConfig's declarations (the serving ones are the jobs')."""
    from spark_cnn.bench.sidecar_bench import SidecarBenchConfig

    return resolution.option_table(SidecarBenchConfig, command=COMMAND)


def register(commands) -> None:
    parser = commands.add_parser(COMMAND, help="dynamic batching on vs off vs the device alone (no Spark)")
    flags.add_options(parser, option_table())
    parser.add_argument("--json", help="write the results here")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from spark_cnn.bench.sidecar_bench import SidecarBenchConfig, run_sidecar_bench

    values = resolution.given(args)
    values.pop("json", None)
    config = resolution.build(SidecarBenchConfig, values)
    result = run_sidecar_bench(config)
    print(f"{config.model} on {result['machine']}")
    shape = ("x".join(map(str, result["input_shape"])) if result["input_shape"] else
             "own-size (" + ", ".join(f"{h}x{w}" for h, w in result["input_sizes"]) + ")")
    print(f"  on           {result['on']:9.1f} img/s  (batch {result['batch_size']}; {shape} input, "
          f"{result['on_gb_per_s']} GB/s into the sidecar)")
    print(f"  off          {result['off']:9.1f} img/s  (batch {config.request_size})")
    print(f"  device_only  {result['device_only']:9.1f} img/s")
    print(f"  on/off {result['on_over_off']}x   on/device_only {result['on_over_device_only']}")
    write_json(args.json, result)
    return 0
