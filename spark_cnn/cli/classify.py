"""`spark-cnn classify`: images in, one Parquet row per image out."""

from __future__ import annotations

import argparse
import dataclasses
import functools

from spark_cnn.cli import options
from spark_cnn.cli.common import floats
from spark_cnn.cli.options import Option, flags_only, given


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


def add_arguments(parser: argparse.ArgumentParser, *, from_preset: bool = False) -> None:
    """INPUT, OUTPUT and every classify option. From a preset, INPUT and OUTPUT may come from the file."""
    positional = {"nargs": "?"} if from_preset else {}
    parser.add_argument("input", metavar="INPUT", help="folder of images (searched recursively), path or URI",
                        **positional)
    parser.add_argument("output", metavar="OUTPUT", help="Parquet output directory, path or URI", **positional)
    add_classify_options(parser)


def register(commands) -> None:
    parser = commands.add_parser("classify", help="classify every image under INPUT into Parquet at OUTPUT")
    add_arguments(parser)
    flags_only(parser)  # defaults come from the resolver, after the preset and spark.cnn.* settings
    parser.set_defaults(run=run)


@functools.cache
def option_table() -> dict[str, Option]:
    """Every classify option: the parser's, then ClassifyConfig's fields without a flag."""
    from spark_cnn.config import ClassifyConfig

    parser = argparse.ArgumentParser(add_help=False)
    add_arguments(parser)
    return options.option_table(parser, ClassifyConfig)


def classify_config(args: argparse.Namespace, *, preset: dict | None = None, preset_name: str = "preset",
                    spark_conf: dict | None = None):
    """ClassifyConfig from parsed flags, over a preset, over spark.cnn.* settings, over defaults."""
    return config_from(options.resolve(option_table(), flags=given(args), preset=preset, preset_name=preset_name,
                                       spark_conf=spark_conf))


# Options that describe the model rather than the job: they become the ModelSpec.
MODEL_OPTIONS = ("model", "weights", "resize", "crop", "mean", "std")
PREPROCESSING_OPTIONS = ("resize", "crop", "mean", "std")


def config_from(values: dict):
    """ClassifyConfig from resolved option values: every value whose name is a ClassifyConfig field goes in."""
    from spark_cnn.config import ClassifyConfig, parse_batch_size
    from spark_cnn.models.spec import ModelSpec

    fields = {f.name for f in dataclasses.fields(ClassifyConfig)}
    kwargs = {k: v for k, v in values.items() if k in fields and k not in MODEL_OPTIONS}
    # Only the fields given: the rest come from the model's own preprocessing when the model is resolved.
    prep = {k: values[k] for k in PREPROCESSING_OPTIONS if values.get(k) is not None}
    kwargs["model"] = ModelSpec(values["model"], weights=values.get("weights"), preprocessing=prep or None)
    if isinstance(kwargs.get("batch_size"), str):
        kwargs["batch_size"] = parse_batch_size(kwargs["batch_size"])
    return ClassifyConfig(**kwargs)


def report(summary: dict) -> str:
    """The short table a person reads after a job: totals, then one line per sidecar, then where the output is."""
    accuracy = "n/a" if summary.get("accuracy") is None else f"{summary['accuracy']:.4f}"
    rate = "n/a" if summary["images_per_s"] is None else summary["images_per_s"]
    lines = [
        f"images      {summary['images']}",
        f"errors      {summary['errors']}",
        f"images/s    {rate}  ({summary['elapsed_s']} s)",
        f"batch size  {summary['batch_size'] or 'auto'}",
        f"accuracy    {accuracy}",
        f"sidecars    {len(summary['sidecars'])}",
        *sidecar_table(summary["sidecars"]),
        f"output      {summary['output']}",
    ]
    return "\n".join(lines)


def sidecar_table(sidecars: list[dict]) -> list[str]:
    """One indented line per sidecar: where it ran, what it served, how full its batches were."""
    if not sidecars:
        return []
    header = ("executor", "host", "pid", "device", "requests", "batches", "mean batch")
    rows = [tuple(str(s.get(k, "")) for k in ("executor", "host", "pid", "device", "requests", "batches",
                                              "mean_batch_size")) for s in sidecars]
    widths = [max(len(r[i]) for r in (header, *rows)) for i in range(len(header))]
    return ["  " + "  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip()
            for r in (header, *rows)]


def run(args: argparse.Namespace) -> int:
    from spark_cnn.spark.conf import submitted_conf

    return execute(options.resolve(option_table(), flags=given(args), spark_conf=submitted_conf()))


def execute(values: dict) -> int:
    """Run the classify job on resolved options and print its report."""
    from spark_cnn.spark.classify_job import classify

    config = config_from(values)
    summary = classify(config)
    if not config.quiet:
        print(report(summary))
    return 0
