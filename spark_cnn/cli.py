"""`spark-cnn`: the command line. The same code runs behind `spark-submit jobs/<job>.py`.

Every SparkCnnError ends the command with one line on stderr and exit status 2; nothing else is printed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from spark_cnn.errors import SparkCnnError

DEFAULT_DEMO_DIR = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"),
                                "spark_cnn", "demo")
EXIT_ERROR = 2


def _floats(text: str) -> tuple[float, ...]:
    return tuple(float(v) for v in text.split(","))


def _add_classify_options(parser: argparse.ArgumentParser) -> None:
    model = parser.add_argument_group("model")
    model.add_argument("--model", default="resnet50",
                       help="torchvision model name, TorchScript file, or module:factory (default: resnet50)")
    model.add_argument("--weights", help="state_dict file for the model (loaded with weights_only=True)")
    model.add_argument("--labels", help="class names, one per line, in class-index order")
    model.add_argument("--top-k", type=int, help="classes to keep per image (default: min(5, classes))")
    model.add_argument("--resize", type=int, help="shorter side before cropping (default: the model's, else 256)")
    model.add_argument("--crop", type=int, help="centre crop size (default: the model's, else 224)")
    model.add_argument("--mean", type=_floats, help="normalisation mean, R,G,B (default: ImageNet)")
    model.add_argument("--std", type=_floats, help="normalisation std, R,G,B (default: ImageNet)")
    run = parser.add_argument_group("run")
    run.add_argument("--master", help="Spark master URL (default: Spark's, local[*] outside spark-submit)")
    run.add_argument("--batch-size", default="auto", help="rows per device batch: auto or N")
    run.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    run.add_argument("--precision", default="auto", choices=["auto", "fp32", "bf16", "fp16"],
                     help="auto: fp32 on CPU; on CUDA bf16 where top-1 agrees with fp32 on >= 99%% of the first images")
    run.add_argument("--channels-last", action=argparse.BooleanOptionalAction, default=None,
                     help="NHWC memory layout (default: on for CUDA)")
    run.add_argument("--compile", action="store_true", help="torch.compile the model in the sidecar")
    run.add_argument("--decode", default="task", choices=["task", "sidecar", "gpu"],
                     help="where images are decoded: Spark tasks, sidecar threads, or the GPU (nvJPEG)")
    run.add_argument("--threads", type=int, help="torch CPU threads in each sidecar (default: half the cores)")
    run.add_argument("--on-error", default="record", choices=["record", "fail"],
                     help="an unreadable image: record it in the error column, or fail the job")
    out = parser.add_argument_group("output")
    out.add_argument("--logits", action="store_true", help="add the logits column")
    out.add_argument("--embeddings", action="store_true", help="add the embedding column (last layer's input)")
    out.add_argument("--summary", help="also write the JSON summary here")
    out.add_argument("--overwrite", action="store_true", help="replace OUTPUT if it exists")
    out.add_argument("--quiet", action="store_true", help="print nothing but errors")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="spark-cnn", description="Run CNN models over image datasets on Spark.")
    commands = parser.add_subparsers(dest="command", required=True)

    classify = commands.add_parser("classify", help="classify every image under INPUT into Parquet at OUTPUT")
    classify.add_argument("input", metavar="INPUT", help="folder of images (searched recursively), path or URI")
    classify.add_argument("output", metavar="OUTPUT", help="Parquet output directory, path or URI")
    _add_classify_options(classify)

    bench = commands.add_parser("bench-sidecar", help="dynamic batching on vs off vs the device alone (no Spark)")
    bench.add_argument("--model", default="mobilenet_v3_small", help="torchvision model (random weights)")
    bench.add_argument("--clients", type=int, default=4, help="client processes (default 4)")
    bench.add_argument("--request-size", type=int, default=1, help="images per request (default 1)")
    bench.add_argument("--batch-size", default="auto", help="target batch with batching on: auto or N")
    bench.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    bench.add_argument("--decode", default="task", choices=["task", "sidecar", "gpu"],
                       help="task: clients send pixels; sidecar/gpu: clients send JPEG files")
    bench.add_argument("--precision", default="auto", choices=["auto", "fp32", "bf16", "fp16"])
    bench.add_argument("--channels-last", action=argparse.BooleanOptionalAction, default=None)
    bench.add_argument("--compile", action="store_true")
    bench.add_argument("--threads", type=int, help="torch CPU threads in the sidecar and the device-only run")
    bench.add_argument("--seconds", type=float, default=10.0, help="measured seconds per mode and round")
    bench.add_argument("--warmup", type=float, default=3.0, help="warm-up seconds before each measurement")
    bench.add_argument("--rounds", type=int, default=2, help="off/on alternations (default 2)")
    bench.add_argument("--in-flight", type=int, help="requests each client keeps in flight (default: 64 images' worth)")
    bench.add_argument("--json", help="write the results here")

    profile = commands.add_parser("profile", help="per-layer costs and the predicted latency curve of a model")
    profile.add_argument("--model", required=True, help="torchvision model name, TorchScript file, or module:factory")
    profile.add_argument("--weights", help="state_dict file (time does not depend on the values)")
    profile.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N (default cpu)")
    profile.add_argument("--batch-sizes", default="1,2,4,8,16,32,64", help="comma-separated batch sizes")
    profile.add_argument("--threads", type=int, help="torch CPU threads (default: the sidecar's, half the cores)")
    profile.add_argument("--tuning", default="performance", choices=["performance", "memory"])
    profile.add_argument("--validate", action="store_true", help="also measure each batch size and report errors")
    profile.add_argument("--recalibrate", action="store_true", help="measure the device again")
    profile.add_argument("--calibration-seconds", type=float,
                         help="time calibration may take when the device has no cached profile (default 45)")
    profile.add_argument("--json", help="write the result here")
    profile.add_argument("--plot", help="write a PNG of the predicted (and measured) curve here")

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

    demo = commands.add_parser("demo", help="classify scikit-learn's digits with a small CNN trained on the spot")
    demo.add_argument("--workdir", default=DEFAULT_DEMO_DIR, help=f"demo data and model (default: {DEFAULT_DEMO_DIR})")
    demo.add_argument("--output", help="Parquet output (default: WORKDIR/output)")
    demo.add_argument("--master", default="local[2]", help="Spark master URL (default: local[2])")
    demo.add_argument("--summary", help="also write the JSON summary here")
    return parser


def classify_config(args: argparse.Namespace):
    from spark_cnn.config import ClassifyConfig, parse_batch_size
    from spark_cnn.models.spec import ModelSpec

    # Only the fields given: the rest come from the model's own preprocessing when the model is resolved.
    prep = {k: getattr(args, k) for k in ("resize", "crop", "mean", "std") if getattr(args, k) is not None}
    return ClassifyConfig(
        input=args.input, output=args.output,
        model=ModelSpec(args.model, weights=args.weights, preprocessing=prep or None),
        labels=args.labels, top_k=args.top_k, master=args.master, batch_size=parse_batch_size(args.batch_size),
        device=args.device, precision=args.precision, channels_last=args.channels_last, compile=args.compile,
        decode=args.decode, threads=args.threads, on_error=args.on_error, summary=args.summary, logits=args.logits,
        embeddings=args.embeddings, overwrite=args.overwrite, quiet=args.quiet)


def report(summary: dict) -> str:
    """The lines a person reads after a job."""
    accuracy = "n/a" if summary["accuracy"] is None else f"{summary['accuracy']:.4f}"
    sidecars = ", ".join(f"{s['executor']}@{s['host']} pid {s['pid']} {s['device']}: {s['requests']} requests, "
                         f"{s['batches']} batches, mean batch {s['mean_batch_size']}" for s in summary["sidecars"])
    return "\n".join([
        f"images      {summary['images']}",
        f"errors      {summary['errors']}",
        f"images/s    {summary['images_per_s']}  ({summary['elapsed_s']} s)",
        f"batch size  {summary['batch_size']}",
        f"accuracy    {accuracy}",
        f"sidecars    {len(summary['sidecars'])}: {sidecars or 'none'}",
        f"output      {summary['output']}",
    ])


def _run_classify(args: argparse.Namespace) -> int:
    from spark_cnn.spark.classify_job import classify

    config = classify_config(args)
    summary = classify(config)
    if not config.quiet:
        print(report(summary))
    return 0


def _run_bench_sidecar(args: argparse.Namespace) -> int:
    from spark_cnn.bench.sidecar_bench import SidecarBenchConfig, run_sidecar_bench
    from spark_cnn.config import parse_batch_size
    from spark_cnn.errors import ConfigError

    if args.clients < 1 or args.request_size < 1 or args.rounds < 1 or args.seconds <= 0:
        raise ConfigError("--clients, --request-size, --rounds and --seconds must be positive")
    config = SidecarBenchConfig(
        model=args.model, clients=args.clients, request_size=args.request_size,
        batch_size=parse_batch_size(args.batch_size), device=args.device, decode=args.decode,
        precision=args.precision, channels_last=args.channels_last, compile=args.compile, threads=args.threads,
        warmup_s=args.warmup, measure_s=args.seconds, rounds=args.rounds, max_in_flight=args.in_flight)
    result = run_sidecar_bench(config)
    print(f"{config.model} on {result['machine']}")
    print(f"  on           {result['on']:9.1f} img/s  (batch {result['batch_size']})")
    print(f"  off          {result['off']:9.1f} img/s  (batch {config.request_size})")
    print(f"  device_only  {result['device_only']:9.1f} img/s")
    print(f"  on/off {result['on_over_off']}x   on/device_only {result['on_over_device_only']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return 0


def _run_profile(args: argparse.Namespace) -> int:
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
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    if args.plot:
        plot_profile(result, args.plot)
    return 0


def _run_plan(args: argparse.Namespace) -> int:
    from spark_cnn.models.spec import ModelSpec
    from spark_cnn.perf.commands import plan_job, plan_report

    result = plan_job(ModelSpec(args.model, weights=args.weights), images=args.images, executors=args.executors,
                      cores=args.cores, device=args.device, threads=args.threads,
                      calibration_s=args.calibration_seconds)
    print(plan_report(result))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return 0


def _run_demo(args: argparse.Namespace) -> int:
    from spark_cnn.config import ClassifyConfig
    from spark_cnn.models.demo import DIGITS_FACTORY, prepare_demo
    from spark_cnn.models.spec import ModelSpec
    from spark_cnn.spark.classify_job import classify

    assets = prepare_demo(args.workdir)
    if assets.train_accuracy is not None:
        print(f"trained the digits CNN: held-out accuracy {assets.train_accuracy:.4f} -> {assets.weights}")
    config = ClassifyConfig(
        input=assets.images, output=args.output or os.path.join(args.workdir, "output"),
        model=ModelSpec(DIGITS_FACTORY, weights=assets.weights), labels=assets.labels, master=args.master,
        summary=args.summary, overwrite=True)
    print(report(classify(config)))
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    handlers = {"classify": _run_classify, "demo": _run_demo, "bench-sidecar": _run_bench_sidecar,
                "profile": _run_profile, "plan": _run_plan}
    try:
        return handlers[args.command](args)
    except SparkCnnError as e:
        print(f"spark-cnn {args.command}: error: {e}", file=sys.stderr)
        return EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main())
