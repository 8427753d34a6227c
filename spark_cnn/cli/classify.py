"""`spark-cnn classify`: images in, one Parquet row per image out."""

from __future__ import annotations

import argparse
import functools

from spark_cnn.cli import resolution
from spark_cnn.cli.common import floats
from spark_cnn.cli.resolution import Option, flags_only, given
from spark_cnn.config import INPUT_FORMATS, ON_ERROR_CHOICES, PARTITION_COLUMNS
from spark_cnn.errors import ConfigError
from spark_cnn.imaging.limits import DEFAULT_MAX_FILE_BYTES, DEFAULT_MAX_PIXELS
from spark_cnn.imaging.preprocess import INTERPOLATIONS
from spark_cnn.task.client import REPLY_TIMEOUT_S
from spark_cnn.task.object_store import OPTION_KEYS, StorageOptions
from spark_cnn.task.run_options import DECODE_CHOICES, PRECISIONS
from spark_cnn.task.schema import CLASSES, OUTPUT_KINDS


def add_input_options(parser: argparse.ArgumentParser) -> None:
    inputs = parser.add_argument_group("input")
    inputs.add_argument("--input-format", default="auto", choices=INPUT_FORMATS,
                        help="auto: petastorm if INPUT has a Unischema, parquet if it holds only .parquet files, else "
                             "images; image = Spark's image data source")
    inputs.add_argument("--glob", help="only image files whose name matches, e.g. '*.jpg' or '*.{jpg,png}'")
    inputs.add_argument("--image-column", help="parquet/petastorm: the image column (default: the only one)")
    inputs.add_argument("--path-column", help="parquet/petastorm: the row id written as `path` (default: a column "
                                              "named path, id, ...; else file#row)")
    inputs.add_argument("--label-column", help="parquet/petastorm: the true class (name or index), for accuracy")
    inputs.add_argument("--storage-option", dest="storage_options", action=StorageOptionsAction, default=(),
                        type=storage_pairs, metavar="KEY=VALUE",
                        help="object-store inputs (s3://, gs://, abfs://, az://, hdfs://): a setting for the driver's "
                             "listing and the tasks' reads, over the store's own credential chain; repeatable. Keys: "
                             f"{', '.join(OPTION_KEYS)} (e.g. endpoint=http://127.0.0.1:9000, region=eu-west-1, "
                             "anonymous=true)")


class _BadPairs(argparse.ArgumentTypeError, ValueError):
    """argparse shows its message as the flag's error; the resolver (presets, spark.cnn.*) catches ValueError."""


def storage_pairs(text: str) -> tuple[tuple[str, str], ...]:
    """`k=v[,k=v...]` -> ((k, v), ...): argparse type of --storage-option (and its preset / spark.cnn value)."""
    try:
        return StorageOptions.parse(text).pairs
    except ConfigError as e:
        raise _BadPairs(str(e).removeprefix("--storage-option ")) from None


storage_pairs.accepts_mapping = True  # a preset may give the pairs as a YAML mapping (resolution.convert)


class StorageOptionsAction(argparse.Action):
    """Repeated --storage-option flags add up (each may hold several comma-separated KEY=VALUE pairs)."""

    def __call__(self, parser, namespace, values, option_string=None):
        before = getattr(namespace, self.dest, None)
        before = before if isinstance(before, tuple) else ()
        try:
            setattr(namespace, self.dest, StorageOptions.parse((*before, *values)).pairs)
        except ConfigError as e:
            raise argparse.ArgumentError(self, str(e).removeprefix("--storage-option: ")) from None


def add_decode_limits(group) -> None:
    """The guard rails every decode passes (imaging.limits.DecodeOptions), for each command that decodes."""
    group.add_argument("--max-pixels", type=int, default=DEFAULT_MAX_PIXELS,
                       help="refuse images with more pixels, from the header, before decoding (decompression bombs; "
                            f"default {DEFAULT_MAX_PIXELS}, Pillow's own warning threshold)")
    group.add_argument("--max-file-bytes", type=int, default=DEFAULT_MAX_FILE_BYTES,
                       help=f"refuse larger files before parsing them (default {DEFAULT_MAX_FILE_BYTES}, 64 MiB)")


def add_on_error(group) -> None:
    group.add_argument("--on-error", default="record", choices=ON_ERROR_CHOICES,
                       help="an unreadable image: record it in the error column, or fail the job")


# Each command's default model: small torchvision models that run on a CPU.
DEFAULT_MODELS = {"classify": "resnet50", "detect": "fasterrcnn_mobilenet_v3_large_320_fpn",
                  "segment": "lraspp_mobilenet_v3_large"}


def add_classify_options(parser: argparse.ArgumentParser, *, embed: bool = False, task: str = "classify") -> None:
    """The options of classify; `embed=True`: those of embed (--layer instead of labels, top-k and extra columns);
    `task` detect or segment: those of detect and segment (no classification heads; detect's own limits, segment's
    resize)."""
    add_input_options(parser)
    model = parser.add_argument_group("model")
    model.add_argument("--model", default=DEFAULT_MODELS[task],
                       help="torchvision model name, TorchScript file, module:factory, timm:NAME[.TAG] (the timm "
                            "extra), or an MLflow PyTorch model: models:/NAME/VERSION, models:/NAME@ALIAS, "
                            "runs:/RUN_ID/PATH or a local MLflow model directory (the mlflow extra); default "
                            f"{DEFAULT_MODELS[task]}")
    model.add_argument("--weights", help="state_dict file (loaded with weights_only=True); for a torchvision model "
                                         "also its weights by name (DEFAULT, IMAGENET1K_V2, ResNet50_Weights."
                                         "IMAGENET1K_V2: from TORCH_HOME's cache, else downloaded once); for a timm "
                                         "model DEFAULT (timm's pretrained weights); or random")
    if embed:
        model.add_argument("--layer", help="module whose output is the embedding (a name from the model's "
                                           "named_modules(), e.g. layer4; averaged over space; default: the "
                                           "input of the last Linear layer)")
    else:
        model.add_argument("--labels", help="class names, one per line, in class-index order (default: the named "
                                            "torchvision weights' categories, or timm's pretrained label names)")
    if task == "classify" and not embed:
        model.add_argument("--top-k", type=int, help="classes to keep per image (default: min(5, classes))")
    if task == "detect":
        model.add_argument("--min-score", type=float, help="drop boxes scoring less (default 0: all the model keeps)")
        model.add_argument("--max-detections", type=int,
                           help="keep at most this many boxes per image, best first (default: the model's limit)")
    else:
        add_preprocessing_options(model, crop=task == "classify")
    run = parser.add_argument_group("run")
    run.add_argument("--master", help="Spark master URL (default: Spark's, local[*] outside spark-submit)")
    run.add_argument("--remote", metavar="sc://HOST:PORT",
                     help="run on this Spark Connect server (default: SPARK_REMOTE when set, as pyspark reads it)")
    run.add_argument("--batch-size", default="auto", help="rows per device batch: auto or N")
    run.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    run.add_argument("--precision", default="auto", choices=PRECISIONS,
                     help="auto: fp32 on CPU; on CUDA bf16 where top-1 agrees with fp32 on >= 99%% of the first images")
    run.add_argument("--channels-last", action=argparse.BooleanOptionalAction, default=None,
                     help="NHWC memory layout (default: on for CUDA)")
    run.add_argument("--compile", action="store_true", help="torch.compile the model in the sidecar")
    run.add_argument("--decode", default="auto", choices=DECODE_CHOICES,
                     help="where images are decoded: Spark tasks, sidecar threads, or the GPU (nvJPEG); auto: the "
                     "sidecar picks from its device, the decode cost and the model's predicted rate")
    run.add_argument("--threads", type=int, help="torch CPU threads per compute thread of a CPU sidecar "
                     "(default: half the cores; up to two compute threads cover the cores)")
    run.add_argument("--request-timeout", dest="request_timeout_s", type=float, default=REPLY_TIMEOUT_S,
                     metavar="SECONDS", help="a sidecar that neither answers a request nor completes any batch "
                                             "for this long is stopped and the task retried; waiting behind other "
                                             f"tasks' batches does not count (default: {REPLY_TIMEOUT_S:g})")
    run.add_argument("--device-profile", metavar="FILE",
                     help="a device profile exported with `spark-cnn profile --export` (on a host of the executors' "
                          "device): the sidecars start their batch size from it instead of their own cached profile")
    add_on_error(run)
    add_decode_limits(run)
    out = parser.add_argument_group("output")
    if not embed and task == "classify":
        out.add_argument("--output", dest="output_kind", default=CLASSES, choices=OUTPUT_KINDS, metavar="KIND",
                         help="classes: label, score, top-k (default); raw: the model's one output tensor per image "
                              "as `raw` (array<float>, row-major) and `shape` (array<int>), for any model that is "
                              "not a classifier")
        out.add_argument("--logits", action="store_true", help="add the logits column")
        out.add_argument("--embeddings", action="store_true", help="add the embedding column (last layer's input)")
    out.add_argument("--summary", help="also write the JSON summary here")
    if task == "classify":
        out.add_argument("--partition-by", choices=PARTITION_COLUMNS,
                         help="partition the Parquet output by this column")
    out.add_argument("--overwrite", action="store_true", help="replace OUTPUT if it exists")
    out.add_argument("--quiet", action="store_true", help="print nothing but errors")


def add_preprocessing_options(group, *, crop: bool = True) -> None:
    """How images become model input: resize (and crop, for classifiers), filter, normalisation."""
    group.add_argument("--resize", type=int, help="shorter side before cropping (default: the weights' or the "
                                                  "model's, else 256)" if crop else
                       "shorter side the image is sent at (default: the weights', else 520)")
    if crop:
        group.add_argument("--crop", type=int, help="centre crop size (default: the weights' or the model's, else 224)")
    group.add_argument("--interpolation", choices=INTERPOLATIONS,
                       help="resize filter (default: the weights' or the model's, else bilinear)")
    group.add_argument("--mean", type=floats, help="normalisation mean, R,G,B (default: the weights', else ImageNet)")
    group.add_argument("--std", type=floats, help="normalisation std, R,G,B (default: the weights', else ImageNet)")


def add_arguments(parser: argparse.ArgumentParser, *, from_preset: bool = False, embed: bool = False,
                  task: str = "classify") -> None:
    """INPUT, OUTPUT and every classify (or embed, detect, segment) option. From a preset, INPUT and OUTPUT may come
    from the file."""
    positional = {"nargs": "?"} if from_preset else {}
    parser.add_argument("input", metavar="INPUT", help="folder of images (searched recursively), path or URI",
                        **positional)
    parser.add_argument("output", metavar="OUTPUT", help="Parquet output directory, path or URI", **positional)
    add_classify_options(parser, embed=embed, task=task)


def register(commands) -> None:
    parser = commands.add_parser("classify", help="classify every image under INPUT into Parquet at OUTPUT")
    add_arguments(parser)
    flags_only(parser)  # defaults come from the resolver, after the preset and spark.cnn.* settings
    parser.set_defaults(run=run)


@functools.cache
def option_table(embed: bool = False, task: str = "classify") -> dict[str, Option]:
    """Every classify (or embed, detect, segment) option: the parser's, then ClassifyConfig's fields without a
    flag."""
    from spark_cnn.config import ClassifyConfig

    parser = argparse.ArgumentParser(add_help=False)
    add_arguments(parser, embed=embed, task=task)
    return resolution.option_table(parser, ClassifyConfig)


def classify_config(args: argparse.Namespace, *, embed: bool = False, preset: dict | None = None,
                    preset_name: str = "preset", spark_conf: dict | None = None, task: str = "classify"):
    """ClassifyConfig from parsed flags, over a preset, over spark.cnn.* settings, over defaults. `embed=True`:
    the embed command's options (no labels, top-k or extra columns; the embedding on, from `--layer`); `task`:
    detect's or segment's."""
    values = resolution.resolve(option_table(embed, task), flags=given(args), preset=preset,
                                preset_name=preset_name, spark_conf=spark_conf)
    if embed:
        values.update(embeddings=True, logits=False, labels=None, top_k=None)
    if task != "classify":
        values.update(task=task)
    return config_from(values)


# Options that describe the model rather than the job: they become the ModelSpec.
MODEL_OPTIONS = ("model", "weights", "resize", "crop", "interpolation", "mean", "std")
PREPROCESSING_OPTIONS = ("resize", "crop", "interpolation", "mean", "std")


def config_from(values: dict, config: type | None = None):
    """ClassifyConfig (or `config`, e.g. EtlConfig) from resolved option values: each value fills the field of its
    flat name, nested ones too (resolution.build); the model options become the ModelSpec."""
    from spark_cnn.config import ClassifyConfig

    return resolution.build(config or ClassifyConfig, with_model_spec(values))


def with_model_spec(values: dict) -> dict:
    """`values` with `model` a ModelSpec (from the MODEL_OPTIONS) and `batch_size` a number or None."""
    from spark_cnn.config import parse_batch_size
    from spark_cnn.models.spec import ModelSpec

    # Only the fields given: the rest come from the model's own preprocessing when the model is resolved.
    prep = {k: values[k] for k in PREPROCESSING_OPTIONS if values.get(k) is not None}
    spec = ModelSpec(values["model"], weights=values.get("weights"), preprocessing=prep or None)
    batch_size = values.get("batch_size")
    return {**values, "model": spec,
            "batch_size": parse_batch_size(batch_size) if isinstance(batch_size, str) else batch_size}


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
    table = ["  " + "  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip()
             for r in (header, *rows)]
    # A sidecar whose batches disagreed with the device profile for long enough says so, and what it did.
    for s in sidecars:
        check = s.get("prediction") or {}
        if check.get("message"):
            action = f"; {check['action']}" if check.get("action") else ""
            table.append(f"  executor {s.get('executor')}: {check['message']}{action}")
    return table


def run(args: argparse.Namespace) -> int:
    from spark_cnn.spark.conf import submitted_conf

    return execute(resolution.resolve(option_table(), flags=given(args), spark_conf=submitted_conf()))


def execute(values: dict) -> int:
    """Run the classify job on resolved options and print its report."""
    from spark_cnn.spark.classify_job import classify

    config = config_from(values)
    summary = classify(config)
    if not config.quiet:
        print(report(summary))
    return 0
