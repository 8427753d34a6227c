"""`spark-cnn profile` and `spark-cnn plan`: the analytical performance model on the command line."""

from __future__ import annotations

import argparse

from spark_cnn.cli.common import write_json
from spark_cnn.errors import SparkCnnError
from spark_cnn.models.timing import DEFAULT_BATCH_SIZES
from spark_cnn.perf.tuner import MODES


def register(commands) -> None:
    profile = commands.add_parser("profile", help="per-layer costs and the predicted latency curve of a model")
    profile.add_argument("--model", required=True, help="as classify takes: torchvision name, TorchScript file, "
                                                        "module:factory, timm:NAME or an MLflow model URI/directory")
    profile.add_argument("--weights", help="state_dict file or weights name, as classify takes (time "
                                           "does not depend on the values; the preprocessing's crop does)")
    profile.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N (default cpu)")
    profile.add_argument("--batch-sizes", default=",".join(map(str, DEFAULT_BATCH_SIZES)),
                         help="comma-separated batch sizes")
    profile.add_argument("--threads", type=int, help="torch CPU threads (default: the sidecar's, half the cores)")
    profile.add_argument("--tuning", default=MODES[0], choices=MODES)
    profile.add_argument("--validate", action="store_true", help="also measure each batch size and report errors")
    profile.add_argument("--recalibrate", action="store_true", help="measure the device again")
    profile.add_argument("--calibration-seconds", type=float,
                         help="time calibration may take when the device has no cached profile (default 45)")
    profile.add_argument("--json", help="write the result here")
    profile.add_argument("--plot", help="write a PNG of the predicted (and measured) curve here")
    profile.set_defaults(run=run_profile)

    plan = commands.add_parser("plan", help="predicted wall time and bottleneck of a cluster job")
    plan.add_argument("--model", required=True)
    plan.add_argument("--weights")
    plan.add_argument("--images", type=int, required=True)
    plan.add_argument("--executors", type=int, required=True)
    plan.add_argument("--cores", type=int, help="cores per executor (default: this machine's)")
    plan.add_argument("--device", default="cpu")
    plan.add_argument("--threads", type=int)
    plan.add_argument("--calibration-seconds", type=float)
    plan.add_argument("--json")
    plan.set_defaults(run=run_plan)


def run_profile(args: argparse.Namespace) -> int:
    from spark_cnn.models.spec import ModelSpec
    from spark_cnn.perf.commands import plot_profile, profile_model, profile_report

    try:
        sizes = [int(b) for b in args.batch_sizes.split(",")]
    except ValueError:
        raise SparkCnnError(f"--batch-sizes {args.batch_sizes}: expected comma-separated integers") from None
    result = profile_model(ModelSpec(args.model, weights=args.weights), device=args.device, batch_sizes=sizes,
                           validate=args.validate, threads=args.threads, tuning=args.tuning,
                           refresh=args.recalibrate, calibration_s=args.calibration_seconds)
    print(profile_report(result))
    write_json(args.json, result)
    if args.plot:
        plot_profile(result, args.plot)
    return 0


def run_plan(args: argparse.Namespace) -> int:
    from spark_cnn.models.spec import ModelSpec
    from spark_cnn.perf.commands import plan_job, plan_report

    result = plan_job(ModelSpec(args.model, weights=args.weights), images=args.images, executors=args.executors,
                      cores=args.cores, device=args.device, threads=args.threads,
                      calibration_s=args.calibration_seconds)
    print(plan_report(result))
    write_json(args.json, result)
    return 0
