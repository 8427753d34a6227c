"""`spark-cnn validate`: measure models' per-batch latency against the time model (spark_cnn.perf.validate)."""

from __future__ import annotations

import argparse
import json
import time

from spark_cnn.models.timing import CLOCKS, DEFAULT_BATCH_SIZES, DEFAULT_POINT_BUDGET_S, DEFAULT_REPEATS, DEFAULT_SWEEPS


def register(commands) -> None:
    parser = commands.add_parser("validate", help="measure models' per-batch latency against the time model",
                                 description="Measure models' per-batch latency against the time model.")
    parser.add_argument("--models", required=True, help="comma-separated torchvision model names")
    parser.add_argument("--batch-sizes", default=",".join(map(str, DEFAULT_BATCH_SIZES)))
    parser.add_argument("--repeats", type=int, default=DEFAULT_REPEATS)
    parser.add_argument("--sweeps", type=int, default=DEFAULT_SWEEPS)
    parser.add_argument("--point-budget-s", type=float, default=DEFAULT_POINT_BUDGET_S)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: the sidecar's)")
    parser.add_argument("--layers-at", type=int, default=None, help="per-layer report at this batch size")
    parser.add_argument("--cache-dir", default=None,
                        help="device profiles (default: $SPARK_CNN_CACHE_DIR, else ~/.cache/spark_cnn/devices)")
    parser.add_argument("--refresh", action="store_true", help="calibrate again")
    parser.add_argument("--calibrate-each", action="store_true",
                        help="calibrate again before each model, so that on a busy host the profile and the "
                             "measurements see the same conditions")
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="wall",
                        help="time wall-clock (default) or the computing thread's CPU time (steadier on a busy "
                             "host; also used for calibrating with --refresh or --calibrate-each)")
    parser.add_argument("--json", default=None, help="write all results to this file")
    parser.set_defaults(run=run_validate)


def run_validate(args: argparse.Namespace) -> int:
    from spark_cnn.perf.calibration import calibrate
    from spark_cnn.perf.startpoint import profile_cache_dir
    from spark_cnn.perf.validate import result_table, summary_table, validate

    batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    results, profiles, started = [], [], time.perf_counter()
    profile = None
    for name in args.models.split(","):
        if profile is None or args.calibrate_each:
            profile = calibrate("cpu", threads=args.threads, cache_dir=args.cache_dir or profile_cache_dir(),
                                refresh=args.refresh or args.calibrate_each, clock=args.clock)
            profiles.append({"before": name, "key": profile.key, "created": profile.created,
                             "calibration_s": profile.calibration_s, "notes": list(profile.notes)})
            print(f"profile {profile.key}: calibrated in {profile.calibration_s} s on {profile.created}", flush=True)
        result = validate(name, batch_sizes, profile, repeats=args.repeats, sweeps=args.sweeps,
                          point_budget_s=args.point_budget_s, layers_at=args.layers_at, clock=args.clock)
        results.append(result)
        print(result_table(result), flush=True)
    print(summary_table(results, time.perf_counter() - started), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"profile": profile.key, "profiles": profiles, "results": results}, f, indent=1)
    return 0
