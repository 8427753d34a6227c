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
        device=args.device, on_error=args.on_error, summary=args.summary, logits=args.logits,
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
    handlers = {"classify": _run_classify, "demo": _run_demo}
    try:
        return handlers[args.command](args)
    except SparkCnnError as e:
        print(f"spark-cnn {args.command}: error: {e}", file=sys.stderr)
        return EXIT_ERROR


def print_json(data: dict) -> None:
    print(json.dumps(data, indent=2))


if __name__ == "__main__":
    sys.exit(main())
