"""`spark-cnn profile` and `spark-cnn plan`: the analytical performance model on the command line."""

from __future__ import annotations

import argparse
import sys

from spark_cnn.cli.common import write_json
from spark_cnn.errors import ConfigError, SparkCnnError
from spark_cnn.models.timing import DEFAULT_BATCH_SIZES
from spark_cnn.perf.tuner import MODES

MODEL_HELP = ("as classify takes: torchvision name, TorchScript file, module:factory, timm:NAME or an MLflow model "
              "URI/directory")
WEIGHTS_HELP = ("state_dict file or weights name, as classify takes (time does not depend on the values; the "
                "preprocessing's crop does)")
STRICT_HELP = ("refuse a calibration whose repeated measurements disagree beyond 10%% (a busy host) or whose "
               "transcendental operators time implausibly slow, instead of keeping it with its measured spread and a "
               "warning; a cached noisy profile is measured again")
POOL_HELP = ("how many of this device's latest calibrations on this host the cached profile pools, each point their "
             "median (default 5; 1: a new calibration alone); one calibration prices each point in whatever spell of "
             "a shared host it met")
ALLOW_NOISY_HELP = "deprecated, no effect: noisy calibrations are kept by default (--strict refuses them)"
ALLOW_NOISY_DEPRECATED = ("spark-cnn: warning: --allow-noisy-calibration is deprecated and does nothing: noisy "
                          "calibrations are kept by default; drop it (--strict refuses them)")


def register(commands) -> None:
    profile = commands.add_parser("profile", help="per-layer costs and the predicted latency curve of a model; "
                                                  "--export writes the device's calibration to a file")
    profile.add_argument("--model", help=f"{MODEL_HELP} (needed unless only exporting)")
    profile.add_argument("--weights", help=WEIGHTS_HELP)
    profile.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N (default cpu)")
    profile.add_argument("--batch-sizes", default=",".join(map(str, DEFAULT_BATCH_SIZES)),
                         help="comma-separated batch sizes")
    profile.add_argument("--threads", type=int, help="torch CPU threads (default: the sidecar's, half the cores)")
    profile.add_argument("--tuning", default=MODES[0], choices=MODES,
                         help="how the batch size is picked: performance, the smallest batch within 3%% of the best "
                              "throughput; memory, the smallest within 90%% of it")
    profile.add_argument("--validate", action="store_true", help="also measure each batch size and report errors")
    profile.add_argument("--recalibrate", action="store_true", help="measure the device again")
    profile.add_argument("--calibration-seconds", type=float,
                         help="time calibration may take when the device has no cached profile (default 55)")
    profile.add_argument("--strict", action="store_true", help=STRICT_HELP)
    profile.add_argument("--pool", type=int, metavar="N", help=POOL_HELP)
    profile.add_argument("--allow-noisy-calibration", action="store_true", help=ALLOW_NOISY_HELP)
    profile.add_argument("--export", metavar="FILE",
                         help="write the device's calibration here, for `plan --device-profile FILE` and jobs' "
                              "--device-profile on hosts without this device")
    profile.add_argument("--json", help="write the result here")
    profile.add_argument("--plot", help="write a PNG of the predicted (and measured) curve here")
    profile.set_defaults(run=run_profile)

    plan = commands.add_parser("plan", help="batch size, decode placement and expected images/s of a cluster job; "
                                            "with --device-profile, for a device this host does not have")
    plan.add_argument("--model", required=True, help=MODEL_HELP)
    plan.add_argument("--weights", help=WEIGHTS_HELP)
    plan.add_argument("--images", type=int, required=True, help="images the job classifies")
    plan.add_argument("--executors", type=int, required=True, help="executors, each with one sidecar (one device)")
    plan.add_argument("--cores", type=int, help="cores per executor (default: the profile host's with "
                                                "--device-profile, else this machine's)")
    plan.add_argument("--device", default="cpu", help="the device to calibrate here: cpu | cuda | cuda:N "
                                                      "(default cpu; ignored with --device-profile)")
    plan.add_argument("--device-profile", metavar="FILE",
                      help="a profile exported with `spark-cnn profile --export` on a host with the executors' device; "
                           "nothing is calibrated here")
    plan.add_argument("--threads", type=int, help="torch CPU threads of the calibration (default: the sidecar's, "
                                                  "half the cores)")
    plan.add_argument("--calibration-seconds", type=float,
                      help="time calibration may take when the device has no cached profile (default 55)")
    plan.add_argument("--strict", action="store_true", help=STRICT_HELP + " (ignored with --device-profile)")
    plan.add_argument("--allow-noisy-calibration", action="store_true", help=ALLOW_NOISY_HELP)
    plan.add_argument("--json", help="write the plan here")
    plan.set_defaults(run=run_plan)


def run_profile(args: argparse.Namespace) -> int:
    from spark_cnn.models.spec import ModelSpec
    from spark_cnn.perf_tools.commands import export_device, export_report, plot_profile, profile_model, profile_report

    _deprecated(args)
    if args.model is None and args.export is None:
        raise ConfigError("profile: give --model M (the model to profile), --export FILE (the device's calibration), "
                          "or both")
    if args.export is not None:
        exported = export_device(args.device, args.export, threads=args.threads, refresh=args.recalibrate,
                                 calibration_s=args.calibration_seconds, strict=args.strict, pool=args.pool)
        print(export_report(exported))
        if args.model is None:
            write_json(args.json, exported)
            return 0
    try:
        sizes = [int(b) for b in args.batch_sizes.split(",")]
    except ValueError:
        raise SparkCnnError(f"--batch-sizes {args.batch_sizes}: expected comma-separated integers") from None
    result = profile_model(ModelSpec(args.model, weights=args.weights), device=args.device, batch_sizes=sizes,
                           validate=args.validate, threads=args.threads, tuning=args.tuning,
                           refresh=args.recalibrate and args.export is None, calibration_s=args.calibration_seconds,
                           strict=args.strict, pool=args.pool)
    print(profile_report(result))
    write_json(args.json, result)
    if args.plot:
        plot_profile(result, args.plot)
    return 0


def run_plan(args: argparse.Namespace) -> int:
    from spark_cnn.models.spec import ModelSpec
    from spark_cnn.perf_tools.commands import plan_job, plan_report

    _deprecated(args)
    result = plan_job(ModelSpec(args.model, weights=args.weights), images=args.images, executors=args.executors,
                      cores=args.cores, device=args.device, threads=args.threads,
                      calibration_s=args.calibration_seconds, device_profile=args.device_profile,
                      strict=args.strict)
    print(plan_report(result))
    write_json(args.json, result)
    return 0


def _deprecated(args: argparse.Namespace) -> None:
    if args.allow_noisy_calibration:
        print(ALLOW_NOISY_DEPRECATED, file=sys.stderr)
