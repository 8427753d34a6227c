"""The validation command line, shared by `spark-cnn validate` and `python -m spark_cnn.perf_tools.validate_command`:
named models (spark_cnn.perf_tools.validate) or, with --zoo, every torchvision classifier under a FLOP budget
(spark_cnn.perf_tools.zoo). No torch at import: the CLI builds its parser from here.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from spark_cnn.errors import ConfigError
from spark_cnn.models import timing
from spark_cnn.perf_tools.zoo import DEFAULT_ATTRIBUTE_AT, DEFAULT_MAX_GFLOPS

__all__ = ["add_arguments", "run"]

# Where --zoo keeps its measurements unless --json says otherwise: resuming needs a fixed place.
DEFAULT_ZOO_JSON = "zoo-validation.json"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--models", help="comma-separated torchvision model names")
    which.add_argument("--zoo", action="store_true",
                       help="every torchvision classification model under --max-gflops, at 224 px, resumable "
                            "(--json keeps the measurements; a rerun measures only what is missing)")
    which.add_argument("--heldout", action="store_true",
                       help="as --zoo, over the 12 timm networks never used to develop the time model (the timm "
                            "extra; docs/zoo-heldout.md)")
    which.add_argument("--generated", action="store_true",
                       help="as --zoo, over the hand-written networks drawn from a frozen seed "
                            "(spark_cnn.perf_tools.generated_nets; docs/zoo-generated.md)")
    parser.add_argument("--max-gflops", type=float, default=DEFAULT_MAX_GFLOPS,
                        help="with --zoo: FLOPs per 224 px image (2 x torchvision's multiply-adds), default "
                             f"{DEFAULT_MAX_GFLOPS:g}")
    parser.add_argument("--attribute-at", type=int, default=DEFAULT_ATTRIBUTE_AT,
                        help="with --zoo: time every layer at this batch size to find which operator kinds are "
                             "mispriced (0: do not)")
    parser.add_argument("--markdown", default=None, help="with --zoo: write the tables to this Markdown file")
    parser.add_argument("--batch-sizes", default=",".join(map(str, timing.DEFAULT_BATCH_SIZES)))
    parser.add_argument("--repeats", type=int, default=timing.DEFAULT_REPEATS)
    parser.add_argument("--sweeps", type=int, default=timing.DEFAULT_SWEEPS)
    parser.add_argument("--point-budget-s", type=float, default=timing.DEFAULT_POINT_BUDGET_S)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: the sidecar's)")
    parser.add_argument("--layers-at", type=int, default=None, help="per-layer report at this batch size")
    parser.add_argument("--cache-dir", default=None,
                        help="device profiles (default: $SPARK_CNN_CACHE_DIR, else ~/.cache/spark_cnn/devices)")
    parser.add_argument("--refresh", action="store_true", help="calibrate again")
    parser.add_argument("--calibrate-each", action="store_true",
                        help="calibrate again before each model, so that the profile and the measurements see "
                             "the same conditions (a busy host, or one whose speed drifts by the hour); with "
                             "--zoo each network is judged against its own calibration, kept beside --json")
    parser.add_argument("--pool", type=int, default=None, metavar="N",
                        help="each calibration (--refresh, --calibrate-each) caches the device's latest N pooled, "
                             "each point their median (default 5; 1: each calibration alone)")
    parser.add_argument("--clock", choices=sorted(timing.CLOCKS), default="wall",
                        help="time wall-clock (default) or the computing thread's CPU time (steadier on a busy "
                             "host; also used for calibrating with --refresh or --calibrate-each)")
    parser.add_argument("--judge-pooled", choices=("median", "min"), default=None,
                        help="with --zoo, --heldout or --generated: measure nothing; judge the stored sweep in "
                             "--json against one profile made of its own calibrations (--calibrate-each), each "
                             "point their median or their fastest (spark_cnn.perf_tools.pooled_profile)")
    parser.add_argument("--json", default=None,
                        help=f"write all results to this file (with --zoo: the resumable measurements, default "
                             f"{DEFAULT_ZOO_JSON})")


def run(args: argparse.Namespace) -> int:
    from spark_cnn.perf.startpoint import profile_cache_dir
    from spark_cnn.perf_tools.calibration import calibrate

    batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    if any(b < 1 for b in batch_sizes):
        raise ConfigError(f"--batch-sizes {args.batch_sizes}: expected positive integers")

    def profile_now(refresh: bool = args.refresh or args.calibrate_each):
        pool = {} if args.pool is None else {"pool": args.pool}
        return calibrate("cpu", threads=args.threads, cache_dir=args.cache_dir or profile_cache_dir(),
                         refresh=refresh, clock=args.clock, **pool)
    if args.zoo or args.heldout or args.generated:
        return _run_zoo(args, batch_sizes, profile_now)
    return _run_models(args, batch_sizes, profile_now)


def _run_models(args: argparse.Namespace, batch_sizes: list[int], profile_now) -> int:
    from spark_cnn.perf_tools.validate import result_table, summary_table, validate

    results, profiles, started = [], [], time.perf_counter()
    profile = None
    for name in args.models.split(","):
        if profile is None or args.calibrate_each:
            profile = profile_now()
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


def _run_zoo(args: argparse.Namespace, batch_sizes: list[int], profile_now) -> int:
    from spark_cnn.perf_tools import zoo

    if args.layers_at is not None:
        raise ConfigError("--zoo attributes each network's time to its layers with --attribute-at: drop "
                          "--layers-at")
    if args.attribute_at < 0:
        raise ConfigError(f"--attribute-at {args.attribute_at}: expected a batch size, or 0 for none")
    if args.judge_pooled:
        return _judge_pooled(args, batch_sizes)
    # the common profile judges networks measured without their own calibration
    profile = profile_now(refresh=args.refresh)
    print(f"profile {profile.key}: calibrated in {profile.calibration_s} s on {profile.created}", flush=True)
    if args.clock == "cpu" and profile.threads != 1:
        raise ConfigError(f"--clock cpu times the calling thread: it needs one torch thread, not {profile.threads}")
    flops, excluded, models, networks, shape_of, cost_of = _catalogue(args)
    path = args.json or DEFAULT_ZOO_JSON
    shape = _generated_shape() if args.generated else list(zoo.ZOO_INPUT_SHAPE)
    settings = {"input_shape": shape, "clock": args.clock, "threads": profile.threads,
                "repeats": args.repeats, "warmup": timing.DEFAULT_WARMUP, "point_budget_s": args.point_budget_s,
                "attribute_at": args.attribute_at}
    started, load = time.perf_counter(), os.getloadavg()[0]
    # each network's own calibration is kept even when noisy (calibrate's default): its repeatability is
    # recorded beside it, and refusing it would stop an hour-long sweep midway
    calibrate_each = (lambda: profile_now(refresh=True)) if args.calibrate_each else None
    state = zoo.sweep(path, models, batch_sizes, settings=settings, sweeps=args.sweeps, gflops=flops,
                      log=lambda line: print(line, flush=True), calibrate=calibrate_each,
                      input_shape_of=shape_of)
    print(f"zoo: {len(models)} networks (of {len(flops)}; {len(excluded)} over the budget) measured in "
          f"{(time.perf_counter() - started) / 60:.1f} min, load {load:.2f} -> {os.getloadavg()[0]:.2f}", flush=True)
    judged = zoo.judge(_restricted(state, models, batch_sizes), profile, own_profile=zoo.own_profiles(path, state),
                       cost_of=cost_of)
    return _report(args, judged, batch_sizes, networks)


def _judge_pooled(args: argparse.Namespace, batch_sizes: list[int]) -> int:
    """--judge-pooled: the stored sweep against one profile pooled over its own calibrations; measures nothing."""
    from spark_cnn.perf_tools import zoo
    from spark_cnn.perf_tools.pooled_profile import pool_profiles

    if not args.json or not os.path.exists(args.json):
        raise ConfigError(f"--judge-pooled judges a stored sweep: give its file with --json (got {args.json!r})")
    try:
        with open(args.json) as f:
            state = json.load(f)
    except ValueError as e:
        raise ConfigError(f"{args.json} is not a zoo sweep ({e}); give the --json a sweep wrote") from None
    if not isinstance(state, dict) or state.get("version") != zoo.STATE_VERSION or "models" not in state:
        raise ConfigError(f"{args.json} is not a zoo sweep of version {zoo.STATE_VERSION}; give the --json a sweep "
                          "wrote")
    _, _, models, networks, _, cost_of = _catalogue(args)
    own = zoo.own_profiles(args.json, state)
    profiles = [p for p in (own(name) for name in models if name in state["models"]) if p is not None]
    if not profiles:
        raise ConfigError(f"{args.json} holds no calibration of its own: --judge-pooled needs a sweep made with "
                          "--calibrate-each")
    pooled = pool_profiles(profiles, args.judge_pooled)
    judged = zoo.judge(_restricted(state, models, batch_sizes), pooled, cost_of=cost_of)
    header = (f"Judged against one profile pooled from the sweep's {len(profiles)} calibrations, each point their "
              f"{args.judge_pooled} ({args.json}; nothing measured again).\n")
    return _report(args, judged, batch_sizes, networks, header)


def _catalogue(args: argparse.Namespace) -> tuple:
    """(flops, excluded, models, networks, shape_of, cost_of) of the set --zoo, --heldout or --generated names."""
    from spark_cnn.perf_tools import zoo

    shape_of = cost_of = None
    if args.heldout:
        flops, excluded = zoo.heldout_catalogue(), {}
        models = list(zoo.HELDOUT)
        gflops = sorted(flops.values())
        networks = (f"{len(models)} timm networks held out from the time model's development (none is in "
                    f"torchvision; {gflops[0]:.2f}-{gflops[-1]:.1f} GFLOPs per 224 px image)")
    elif args.generated:
        from spark_cnn.perf_tools.generated_sweep import generated_catalogue

        flops, excluded, networks, shape_of, cost_of = generated_catalogue()
        models = list(flops)
    else:
        flops = zoo.catalogue()
        models, excluded = zoo.select(flops, args.max_gflops)
        networks = ""
    return flops, excluded, models, networks, shape_of, cost_of


def _report(args: argparse.Namespace, judged: dict, batch_sizes: list[int], networks: str, header: str = "") -> int:
    """Print the judgement's tables (and the generated set's targets); write them to --markdown if given."""
    from spark_cnn.perf_tools import zoo

    table = zoo.markdown(judged, max_gflops=args.max_gflops, batch_sizes=batch_sizes, clock=args.clock,
                         networks=networks, header=header)
    if args.generated:
        from spark_cnn.perf_tools.generated_sweep import no_zoo_targets

        table += no_zoo_targets(judged)
    print(table, flush=True)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(table)
    return 0


def _restricted(state: dict, models: list[str], batch_sizes: list[int]) -> dict:
    """The stored sweep as far as this run asked: its models and batch sizes (a file may hold more)."""
    sizes = {str(b) for b in batch_sizes}
    kept = {}
    for name in models:
        entry = state["models"].get(name)
        if entry is None:
            continue
        kept[name] = {**entry, "runs": {b: v for b, v in entry["runs"].items() if b in sizes},
                      "spreads": {b: v for b, v in entry["spreads"].items() if b in sizes}}
    return {**state, "models": kept, "failed": {n: why for n, why in state["failed"].items() if n in models}}


def _generated_shape() -> str:
    from spark_cnn.perf_tools.generated_sweep import settings_shape

    return settings_shape()


if __name__ == "__main__":
    _parser = argparse.ArgumentParser(prog="python -m spark_cnn.perf_tools.validate_command",
                                      description="Measure models' per-batch latency against the time model.")
    add_arguments(_parser)
    sys.exit(run(_parser.parse_args()))
