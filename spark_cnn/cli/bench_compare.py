"""`spark-cnn bench`: this project against a plain PyTorch loop, a row-at-a-time UDF, predict_batch_udf, Ray Data
and Daft."""

from __future__ import annotations

import argparse


def register(commands) -> None:
    from spark_cnn.bench.suite import DEFAULT_MODELS
    from spark_cnn.bench.variants import DEFAULT_VARIANTS, SIDECAR_DECODE_VARIANT, VARIANTS

    parser = commands.add_parser("bench", help="compare with a bare PyTorch loop, a row UDF, predict_batch_udf, "
                                               "Ray Data and Daft")
    parser.add_argument("--quick", action="store_true",
                        help="a smoke run (about 2 minutes): mobilenet_v3_small only, few images, short measurements")
    parser.add_argument("--models", nargs="+",
                        help=f"torchvision models, or identity: a near-free model whose limit is decoding alone; a "
                        f"detection model (e.g. ssdlite320_mobilenet_v3_large) runs spark_cnn against "
                        f"predict_batch_udf on images of several shapes; sim:CURVE (sim:resnet50-h200, "
                        f"sim:2.8+0.107n) is a simulated device: the two spark_cnn paths against a device's latency, "
                        f"with cores per 1k img/s (default: {' '.join(DEFAULT_MODELS)})")
    parser.add_argument("--images", type=int, help="images per variant (default: enough for 24 s at the limit rate)")
    parser.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(DEFAULT_VARIANTS),
                        help=f"which variants to run (default: all but {SIDECAR_DECODE_VARIANT}, the job with "
                             "--decode sidecar as a GPU host runs it; ray_data and daft need the peers extra and "
                             "are skipped without it)")
    parser.add_argument("--repeats", type=int, default=1,
                        help="rounds of every variant, in a rotated order; more than one reports each rate as the "
                             "median with its min-max spread, and each target as the median of per-round ratios "
                             "(make bench: 3)")
    parser.add_argument("--data-dir", help="where the generated images are cached (default ~/.cache/spark_cnn/bench)")
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--plot", help="write a bar chart (PNG) here")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from spark_cnn.bench.report import plot, table, write_json
    from spark_cnn.bench.suite import DEFAULT_MODELS, BenchConfig, run_bench
    from spark_cnn.errors import ConfigError

    if args.images is not None and args.images < 1:
        raise ConfigError(f"--images {args.images}: expected a positive number of images")
    if args.repeats < 1:
        raise ConfigError(f"--repeats {args.repeats}: expected a positive number of rounds")
    models = tuple(args.models or (("mobilenet_v3_small",) if args.quick else DEFAULT_MODELS))
    _check_models(models)
    config = BenchConfig(models=models, images=args.images, quick=args.quick, variants=tuple(args.variants),
                         repeats=args.repeats, **({"data_dir": args.data_dir} if args.data_dir else {}))
    entries = run_bench(config)
    print()
    print("\n\n".join(table(entry) for entry in entries))
    if args.json:
        write_json(args.json, entries)
    if args.plot:
        plot(args.plot, entries)
    return 0


def _check_models(models: tuple[str, ...]) -> None:
    import torchvision

    from spark_cnn.bench.variants import IDENTITY_MODEL
    from spark_cnn.errors import ConfigError
    from spark_cnn.models.device_curve import SIM_PREFIX, parse_curve

    known = (set(torchvision.models.list_models(module=torchvision.models))
             | set(torchvision.models.list_models(module=torchvision.models.detection)) | {IDENTITY_MODEL})
    for model in models:
        if model.startswith(SIM_PREFIX):
            parse_curve(model[len(SIM_PREFIX):])  # a ConfigError naming the forms a simulated device takes
    unknown = [m for m in models if m not in known and not m.startswith(SIM_PREFIX)]
    if unknown:
        raise ConfigError(f"--models {' '.join(unknown)}: not torchvision classification or detection models "
                          f"(e.g. mobilenet_v3_small, resnet18, ssdlite320_mobilenet_v3_large) nor {IDENTITY_MODEL} "
                          f"nor {SIM_PREFIX}CURVE")
