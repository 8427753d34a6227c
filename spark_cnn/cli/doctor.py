"""`spark-cnn doctor`: what the driver and one executor run (versions, Java, GPUs, the sidecar runtime
directory) and whether a sidecar starts there; one line per failed check on stderr and exit status 1."""

from __future__ import annotations

import argparse
import sys

from spark_cnn.cli.common import write_json
from spark_cnn.config import DEVICE_PATTERN
from spark_cnn.errors import ConfigError

EXIT_FAILED = 1
ROWS = ("host", "python", "pyspark", "spark", "pyarrow", "numpy", "pandas", "torch", "torchvision", "pillow",
        "spark_cnn", "java", "gpus", "runtime_dir", "sidecar")


def register(commands) -> None:
    parser = commands.add_parser("doctor", help="check the driver and one executor: versions, Java, device, "
                                                "runtime dir, and that a sidecar starts there")
    parser.add_argument("--master", help="Spark master URL (default: Spark's, local[*] outside spark-submit)")
    parser.add_argument("--device", default="auto", help="the probe sidecar's device: auto, cpu, cuda or cuda:N "
                                                         "(default: auto)")
    parser.add_argument("--json", help="also write what was found as JSON here")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if not DEVICE_PATTERN.match(args.device):
        raise ConfigError(f"--device {args.device}: expected auto, cpu, cuda or cuda:N")
    from spark_cnn.spark.doctor import diagnose
    from spark_cnn.spark.session import spark_session

    spark = spark_session(master=args.master, app_name="spark_cnn-doctor", quiet=True)
    try:
        diagnosis = diagnose(spark, device=args.device)  # its task stops the sidecar it started
    finally:
        spark.stop()
    print(table(diagnosis.driver, diagnosis.executor))
    write_json(args.json, {"app_id": diagnosis.app_id, "driver": diagnosis.driver, "executor": diagnosis.executor,
                           "failures": list(diagnosis.failures)})
    for failure in diagnosis.failures:
        print(f"spark-cnn doctor: FAILED {failure}", file=sys.stderr)
    return EXIT_FAILED if diagnosis.failures else 0


def table(driver: dict, executor: dict | None) -> str:
    """Two columns, driver and executor, one row per fact."""
    name = f"executor {executor.get('executor', '?')}" if executor else "executor"
    lines = [f"{'':<12} {'driver':<32} {name}"]
    for row in ROWS:
        lines.append(f"{row:<12} {_cell(row, driver):<32} {_cell(row, executor) if executor else '-'}")
    return "\n".join(lines)


def _cell(row: str, facts: dict) -> str:
    if row == "java":
        return facts["java"] or f"none ({facts['java_error']})"
    if row == "gpus":
        spark_gpus = facts.get("spark_gpus")
        shown = ", ".join(facts["gpus"]) or "none"
        return f"{shown}; Spark gave {', '.join(spark_gpus) or 'none'}" if spark_gpus is not None else shown
    if row == "runtime_dir":
        return facts["runtime_dir"] or f"refused: {facts['runtime_dir_error']}"
    if row == "sidecar":
        sidecar = facts.get("sidecar")
        if sidecar is None:
            return "-"
        if not sidecar["ok"]:
            return "FAILED"
        return f"ok: pid {sidecar['pid']} on {sidecar['device']}, answered in {sidecar['seconds']} s, stopped"
    value = facts.get(row)
    return "-" if value is None else str(value)
