"""`spark-cnn validate`: measure models' per-batch latency against the time model (spark_cnn.perf_tools.validate), or
the whole torchvision zoo under a FLOP budget (--zoo, spark_cnn.perf_tools.zoo)."""

from __future__ import annotations

from spark_cnn.perf_tools.validate_command import add_arguments, run


def register(commands) -> None:
    parser = commands.add_parser("validate", help="measure models' per-batch latency against the time model",
                                 description="Measure models' per-batch latency against the time model.")
    add_arguments(parser)
    parser.set_defaults(run=run)
