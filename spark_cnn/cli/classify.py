"""`spark-cnn classify`: images in, one Parquet row per image out."""

from __future__ import annotations

import argparse

from spark_cnn.cli.common import floats


def add_classify_options(parser: argparse.ArgumentParser) -> None:
    model = parser.add_argument_group("model")
    model.add_argument("--model", default="resnet50",
                       help="torchvision model name, TorchScript file, or module:factory (default: resnet50)")
    model.add_argument("--weights", help="state_dict file for the model (loaded with weights_only=True)")
    model.add_argument("--labels", help="class names, one per line, in class-index order")
    model.add_argument("--top-k", type=int, help="classes to keep per image (default: min(5, classes))")
    model.add_argument("--resize", type=int, help="shorter side before cropping (default: the model's, else 256)")
    model.add_argument("--crop", type=int, help="centre crop size (default: the model's, else 224)")
    model.add_argument("--mean", type=floats, help="normalisation mean, R,G,B (default: ImageNet)")
    model.add_argument("--std", type=floats, help="normalisation std, R,G,B (default: ImageNet)")
    run = parser.add_argument_group("run")
    run.add_argument("--master", help="Spark master URL (default: Spark's, local[*] outside spark-submit)")
    run.add_argument("--batch-size", default="auto", help="rows per device batch: auto or N")
    run.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    run.add_argument("--precision", default="auto", choices=["auto", "fp32", "bf16", "fp16"],
                     help="auto: fp32 on CPU; on CUDA bf16 where top-1 agrees with fp32 on >= 99%% of the first images")
    run.add_argument("--channels-last", action=argparse.BooleanOptionalAction, default=None,
                     help="NHWC memory layout (default: on for CUDA)")
    run.add_argument("--compile", action="store_true", help="torch.compile the model in the sidecar")
    run.add_argument("--decode", default="auto", choices=["auto", "task", "sidecar", "gpu"],
                     help="where images are decoded: Spark tasks, sidecar threads, or the GPU (nvJPEG); auto: the "
                     "sidecar picks from its device, the decode cost and the model's predicted rate")
    run.add_argument("--threads", type=int, help="torch CPU threads per compute thread of a CPU sidecar "
                     "(default: half the cores; up to two compute threads cover the cores)")
    run.add_argument("--on-error", default="record", choices=["record", "fail"],
                     help="an unreadable image: record it in the error column, or fail the job")
    out = parser.add_argument_group("output")
    out.add_argument("--logits", action="store_true", help="add the logits column")
    out.add_argument("--embeddings", action="store_true", help="add the embedding column (last layer's input)")
    out.add_argument("--summary", help="also write the JSON summary here")
    out.add_argument("--overwrite", action="store_true", help="replace OUTPUT if it exists")
    out.add_argument("--quiet", action="store_true", help="print nothing but errors")


def register(commands) -> None:
    parser = commands.add_parser("classify", help="classify every image under INPUT into Parquet at OUTPUT")
    parser.add_argument("input", metavar="INPUT", help="folder of images (searched recursively), path or URI")
    parser.add_argument("output", metavar="OUTPUT", help="Parquet output directory, path or URI")
    add_classify_options(parser)
    parser.set_defaults(run=run)


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


def run(args: argparse.Namespace) -> int:
    from spark_cnn.spark.classify_job import classify

    config = classify_config(args)
    summary = classify(config)
    if not config.quiet:
        print(report(summary))
    return 0
